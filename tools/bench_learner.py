#!/usr/bin/env python3
"""Learner speed: sacbot gradient steps/s against the naive yardstick, side by side.

Each round runs the yardstick (../shared/bench/naive_sac_lstm_step.py) and sacbot's
learner (quant on and off) in fresh subprocesses, one after the other, at the same
sizes and 1 torch thread; the median over rounds of each, and the ratio of medians,
are printed.  The last line is JSON.

    python tools/bench_learner.py --rounds 3 --seconds 8 --hidden 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NAIVE = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench", "naive_sac_lstm_step.py"))


def sacbot_steps(a) -> dict:
    """Run in a subprocess: time learner.update on a fixed random batch."""
    import time

    import numpy as np
    import torch

    from sacbot.config import Config
    from sacbot.replay import SequenceReplay
    from sacbot.sac import SACLSTMLearner

    torch.set_num_threads(a.threads)
    cfg = Config(hidden=a.hidden, batch_size=a.batch, seq_len=a.seq_len, quant=a.quant, calib_updates=1,
                 device=a.device)
    learner = SACLSTMLearner(a.obs_dim, a.act_dim, cfg)
    rng = np.random.default_rng(0)
    buf = SequenceReplay(4096, a.obs_dim, a.act_dim)
    for i in range(4096):  # episodes longer than L, so windows are full like the yardstick's
        buf.add(rng.standard_normal(a.obs_dim), rng.uniform(-1, 1, a.act_dim), rng.standard_normal(),
                rng.standard_normal(a.obs_dim), False, i % 500 == 499)
    batches = [buf.sample(a.batch, a.seq_len, rng) for _ in range(8)]
    for i in range(5):
        learner.update(batches[i % 8])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        learner.update(batches[n % 8])
        n += 1
    dt = time.perf_counter() - t0
    return {"impl": f"sacbot-quant-{a.quant}", "grad_steps": n, "seconds": round(dt, 3),
            "grad_steps_per_s": round(n / dt, 2), "quant_phase": learner.quant_phase,
            "torch_threads": torch.get_num_threads()}


def run(cmd) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--obs-dim", type=int, default=35)
    p.add_argument("--act-dim", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--naive", default=NAIVE, help="path of the yardstick script")
    p.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.quant = a.child
        print(json.dumps(sacbot_steps(a)))
        return
    if not os.path.exists(a.naive):
        sys.exit(f"bench_learner: yardstick not found at {a.naive}; pass --naive PATH")
    sizes = ["--obs-dim", str(a.obs_dim), "--act-dim", str(a.act_dim), "--hidden", str(a.hidden),
             "--batch", str(a.batch), "--seq-len", str(a.seq_len), "--seconds", str(a.seconds),
             "--threads", str(a.threads)]
    res: dict[str, list[float]] = {"naive": [], "on": [], "off": []}
    for r in range(a.rounds):
        res["naive"].append(run([sys.executable, a.naive] + sizes)["grad_steps_per_s"])
        for q in ("on", "off"):
            res[q].append(run([sys.executable, __file__, "--child", q, "--device", a.device] + sizes)
                          ["grad_steps_per_s"])
        print(f"round {r + 1}/{a.rounds}: naive {res['naive'][-1]:.1f}  quant-on {res['on'][-1]:.1f}  "
              f"quant-off {res['off'][-1]:.1f} steps/s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({"bench": "learner", "hidden": a.hidden, "batch": a.batch, "seq_len": a.seq_len,
                      "obs_dim": a.obs_dim, "act_dim": a.act_dim, "threads": a.threads, "rounds": a.rounds,
                      "median_steps_per_s": med, "runs": res,
                      "ratio_quant_on_vs_naive": round(med["on"] / med["naive"], 2),
                      "ratio_quant_off_vs_naive": round(med["off"] / med["naive"], 2)}))


if __name__ == "__main__":
    main()
