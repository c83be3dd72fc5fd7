"""A stand-in bot for runner tests: bumps the real round counter on a clock.

--mode normal: rounds until SIGTERM, then writes final_save.txt and exits 0.
--mode freeze: stops bumping after --after rounds but stays alive (a hung game loop).
--mode crash:  exits 3 after --after rounds.
--latest: writes a stand-in weights/sac_latest.zip first, so the runner has a checkpoint to evaluate.
--eval-result R: plays the eval instead: prints sacbot eval's JSON line with mean return R, exits 0.
The counter continues across restarts, as a real bot's does.
"""

import argparse
import json
import os
import signal
import sys
import threading

from sacbot.store.liveness import RoundCounter

p = argparse.ArgumentParser()
p.add_argument("--mode", default="normal", choices=["normal", "freeze", "crash"])
p.add_argument("--after", type=int, default=3)
p.add_argument("--period", type=float, default=0.05)
p.add_argument("--run-dir")
p.add_argument("--weights-path")
p.add_argument("--seed")
p.add_argument("--quiet", action="store_true")
p.add_argument("--latest", action="store_true")
p.add_argument("--eval-result", type=float)
p.add_argument("--episodes-per-opponent")
p.add_argument("--json", action="store_true")
a = p.parse_args()
if a.eval_result is not None:
    print(json.dumps({"episodes": 1, "mean_return": a.eval_result, "std_return": 0.0, "per_opponent": {}}))
    sys.exit(0)
os.makedirs(a.weights_path, exist_ok=True)
if a.latest:
    with open(os.path.join(a.weights_path, "sac_latest.zip"), "wb") as fh:
        fh.write(b"a stand-in checkpoint")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
counter = RoundCounter(os.path.join(a.weights_path, "round_counter.txt"))
start = counter.value
while not stop.wait(a.period):
    if a.mode == "freeze" and counter.value - start >= a.after:
        continue  # alive but stuck: no more rounds
    counter.bump()
    if a.mode == "crash" and counter.value - start >= a.after:
        sys.exit(3)
with open(os.path.join(a.weights_path, "final_save.txt"), "w") as fh:
    fh.write(str(counter.value))
