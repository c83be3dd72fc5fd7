#!/usr/bin/env python3
"""Learning through the wire: Pendulum-v1 played by a client over ``sacbot serve``'s socket
against the same game played by ``sacbot run``, both in lockstep pace (the learner trains the UTD
steps owed before each reply), the same seeds and step budget.

Each run's final checkpoint is scored the same way: the deployable int8 actor, deterministic, in
numpy, on ``--episodes`` eval episodes of seeds apart from training's.  The rule, fixed before any
run: the two arms agree when the difference of their means over the seeds is at most twice its
standard error, 2 * sqrt(sd_run^2 / n + sd_serve^2 / n).

    python tools/bench/serve_learning.py --steps 10000 --seeds 0 1 2

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from benchlib import ServeProcess  # noqa: E402 - found on the path set above

ENV = "Pendulum-v1"
SACBOT = [sys.executable, "-m", "sacbot"]


def score(path: str, episodes: int, seed: int) -> float:
    import learning as bl

    return bl.evaluate_actor(bl.int8_actor(path), ENV, episodes, seed)


def run_arm(tmp: str, steps: int, seed: int, episodes: int) -> float:
    w = os.path.join(tmp, f"run-{seed}", "w")
    r = subprocess.run(SACBOT + ["run", "--env", ENV, "--pace", "lockstep", "--steps", str(steps), "--seed", str(seed),
                                 "--quiet", "--run-dir", os.path.join(tmp, f"run-{seed}", "run"), "--weights-path", w],
                       capture_output=True, text=True, timeout=7200)
    if r.returncode != 0:
        raise SystemExit(f"bench_serve_learning: sacbot run failed ({r.returncode}): {r.stderr[-2000:]}")
    return score(os.path.join(w, "sac_latest.zip"), episodes, seed)


def serve_arm(tmp: str, steps: int, seed: int, episodes: int) -> float:
    import gymnasium as gym

    from sacbot.serve.client import SacbotClient

    root = os.path.join(tmp, f"serve-{seed}")
    with ServeProcess(root, ["--env", ENV, "--pace", "lockstep", "--seed", str(seed)], stop_timeout=600) as server:
        env = gym.make(ENV)
        played, k = 0, 0
        with SacbotClient("pendulum", env.observation_space, env.action_space, port=server.port, timeout=600) as bot:
            while played < steps:
                # As sacbot run's driver seeds its episodes: the run's seed plus the episode's index.
                obs, _ = env.reset(seed=seed + k)
                bot.new_episode("")
                reward, term, trunc = None, False, False
                while (action := bot.step(obs, reward, term, trunc)) is not None:
                    obs, reward, term, trunc, _ = env.step(action)
                    played += 1
                    if played >= steps and not (term or trunc):
                        trunc = True  # the budget ends the last episode, as --steps does
                k += 1
    if server.proc.returncode != 0:  # it ended on SIGTERM with every bot's final save, or it did not
        raise SystemExit(f"bench_serve_learning: the server exited {server.proc.returncode}")
    return score(os.path.join(root, "pendulum", "weights", "sac_latest.zip"), episodes, seed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=10, help="eval episodes per checkpoint")
    a = p.parse_args()
    if a.steps < 1 or a.episodes < 1 or len(a.seeds) < 2:
        p.error("--steps and --episodes want integers >= 1, and the rule needs at least 2 --seeds")
    res: dict[str, dict[int, float]] = {"run": {}, "serve": {}}
    with tempfile.TemporaryDirectory(prefix="sacbot-serve-learning-") as tmp:
        for seed in a.seeds:
            for arm, fn in (("run", run_arm), ("serve", serve_arm)):
                res[arm][seed] = round(fn(tmp, a.steps, seed, a.episodes), 2)
                print(f"bench_serve_learning: {arm} seed {seed}: {res[arm][seed]}", file=sys.stderr, flush=True)
    n = len(a.seeds)
    mean = {arm: float(np.mean(list(v.values()))) for arm, v in res.items()}
    sd = {arm: float(np.std(list(v.values()), ddof=1)) for arm, v in res.items()}
    se = math.sqrt(sd["run"] ** 2 / n + sd["serve"] ** 2 / n)
    diff = mean["serve"] - mean["run"]
    print(json.dumps({"bench": "serve_learning", "env": ENV, "steps": a.steps, "episodes": a.episodes, "returns": res,
                      "mean": {k: round(v, 2) for k, v in mean.items()}, "sd": {k: round(v, 2) for k, v in sd.items()},
                      "difference": round(diff, 2), "twice_se": round(2 * se, 2), "agree": abs(diff) <= 2 * se}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
