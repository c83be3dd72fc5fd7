#!/usr/bin/env python3
"""Learner speed: sacbot gradient steps/s against the naive yardstick, side by side.

Each round runs the yardstick (a naive SAC-LSTM step script, one recurrent network per Q,
given with ``--naive PATH``) and sacbot's learner (quant on and off) in fresh subprocesses,
one after the other, at the same sizes and 1 torch thread; the median over rounds of each,
and the ratio of medians, are printed.  The last line is JSON.

    python tools/bench/learner.py --naive PATH --rounds 3 --seconds 8 --hidden 64
    python tools/bench/learner.py --naive PATH --flops --hidden 64   # FLOPs per update, no timing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def learner_and_batches(a, quant: str, n_batches: int):
    """A fresh learner at the bench's sizes, ``n_batches`` sampled from random transitions, and
    the replay they came from."""
    import numpy as np
    import torch

    from sacbot.config import Config
    from sacbot.learning.replay import SequenceReplay
    from sacbot.learning.sac import SACLSTMLearner

    torch.set_num_threads(a.threads)
    cfg = Config(hidden=a.hidden, batch_size=a.batch, seq_len=a.seq_len, quant=quant, calib_updates=1,
                 device=a.device)
    learner = SACLSTMLearner(a.obs_dim, a.act_dim, cfg)
    rng = np.random.default_rng(0)
    buf = SequenceReplay(4096, a.obs_dim, a.act_dim)
    for i in range(4096):  # episodes longer than L, so windows are full like the yardstick's
        buf.add(rng.standard_normal(a.obs_dim), rng.uniform(-1, 1, a.act_dim), rng.standard_normal(),
                rng.standard_normal(a.obs_dim), False, i % 500 == 499)
    burn_in = getattr(a, "burn_in", 0)  # bench_capacity's --burn-in: warm-up steps with mask 0
    return learner, [buf.sample(a.batch, a.seq_len, rng, burn_in) for _ in range(n_batches)], buf


def sacbot_steps(a) -> dict:
    """Run in a subprocess: time learner.update on a fixed random batch."""
    import time

    import torch

    import sacbot

    learner, batches, _ = learner_and_batches(a, a.quant, 8)
    for i in range(5):
        learner.update(batches[i % 8])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        learner.update(batches[n % 8])
        n += 1
    dt = time.perf_counter() - t0
    return {"impl": f"sacbot-quant-{a.quant}", "grad_steps": n, "seconds": round(dt, 3),
            "grad_steps_per_s": round(n / dt, 2), "quant_phase": learner.quant_phase,
            "sacbot": os.path.dirname(os.path.dirname(os.path.abspath(sacbot.__file__))),
            "torch_threads": torch.get_num_threads()}


def count_flops(a) -> dict:
    """FLOPs per update of the matmuls and LSTM gate GEMMs (what dominates; elementwise ops
    are left out), for the yardstick and for sacbot at the same sizes.  The yardstick is
    run with ``--seconds 0``: only its warm-up steps, counted with an optimizer hook (it
    steps three optimizers per gradient step)."""
    import contextlib
    import io
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.flops = {"lstm_forward": 0, "lstm_backward": 0, "matmul": 0}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            op = func._overloadpacket
            if op in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm):
                x, w = args[-2:] if op in (aten.mm, aten.bmm) else args[1:3]
                batch = x.shape[0] if x.dim() == 3 else 1
                self.flops["matmul"] += 2 * batch * x.shape[-2] * x.shape[-1] * w.shape[-1]
            elif op in (aten.mkldnn_rnn_layer, aten.mkldnn_rnn_layer_backward):
                x = args[0]
                hidden, batch_first = (args[10], args[14]) if op is aten.mkldnn_rnn_layer else (args[15], args[21])
                steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
                gates = 2 * steps * batch * 4 * hidden * (x.shape[-1] + hidden)
                if op is aten.mkldnn_rnn_layer:
                    self.flops["lstm_forward"] += gates
                else:  # gradients of the inputs/state and of the weights
                    self.flops["lstm_backward"] += 2 * gates
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(a.threads)
    opt_steps = [0]
    hook = register_optimizer_step_post_hook(lambda *_: opt_steps.__setitem__(0, opt_steps[0] + 1))
    naive = Count()
    argv = sys.argv
    sys.argv = [a.naive, "--obs-dim", str(a.obs_dim), "--act-dim", str(a.act_dim), "--hidden", str(a.hidden),
                "--batch", str(a.batch), "--seq-len", str(a.seq_len), "--seconds", "0"]
    try:
        with naive, contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(a.naive, run_name="__main__")
    finally:
        sys.argv = argv
        hook.remove()
    naive_steps = opt_steps[0] / 3

    learner, (batch,), _ = learner_and_batches(a, "on", 1)
    learner.update(batch)  # calibration: the counted updates fake-quantize
    ours, updates = Count(), 3
    with ours:
        for _ in range(updates):
            learner.update(batch)
    per_naive = {k: v / naive_steps for k, v in naive.flops.items()}
    per_ours = {k: v / updates for k, v in ours.flops.items()}
    return {"bench": "learner-flops", "hidden": a.hidden, "batch": a.batch, "seq_len": a.seq_len,
            "mflop_per_update": {"naive": {k: round(v / 1e6, 1) for k, v in per_naive.items()},
                                 "sacbot": {k: round(v / 1e6, 1) for k, v in per_ours.items()}},
            "naive_over_sacbot": round(sum(per_naive.values()) / sum(per_ours.values()), 2)}


def run(cmd, env=None) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
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
    p.add_argument("--naive", help="path of the yardstick script (required except with --child)")
    p.add_argument("--flops", action="store_true",
                   help="count matmul and LSTM FLOPs per update (naive vs sacbot) instead of timing")
    p.add_argument("--against", metavar="DIR",
                   help="also time, in the same rounds, the quant-on learner of another sacbot checkout "
                        "(for example `git worktree add /tmp/old REV`)")
    p.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.quant = a.child
        print(json.dumps(sacbot_steps(a)))
        return
    if not a.naive or not os.path.exists(a.naive):
        sys.exit(f"bench_learner: yardstick not found at {a.naive!r}; pass --naive PATH")
    if a.flops:
        print(json.dumps(count_flops(a)))
        return
    sizes = ["--obs-dim", str(a.obs_dim), "--act-dim", str(a.act_dim), "--hidden", str(a.hidden),
             "--batch", str(a.batch), "--seq-len", str(a.seq_len), "--seconds", str(a.seconds),
             "--threads", str(a.threads)]
    res: dict[str, list[float]] = {"naive": [], "on": [], "off": []}
    if a.against:
        if not os.path.isfile(os.path.join(a.against, "sacbot", "learning", "sac.py")):
            sys.exit(f"bench_learner: --against {a.against}: no sacbot/learning/sac.py there")
        res["against_on"] = []
    for r in range(a.rounds):
        res["naive"].append(run([sys.executable, a.naive] + sizes)["grad_steps_per_s"])
        for q in ("on", "off"):
            res[q].append(run([sys.executable, __file__, "--child", q, "--device", a.device] + sizes)
                          ["grad_steps_per_s"])
        line = (f"round {r + 1}/{a.rounds}: naive {res['naive'][-1]:.1f}  quant-on {res['on'][-1]:.1f}  "
                f"quant-off {res['off'][-1]:.1f}")
        if a.against:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(a.against)}
            other = run([sys.executable, __file__, "--child", "on", "--device", a.device] + sizes, env=env)
            if os.path.realpath(other["sacbot"]) != os.path.realpath(a.against):
                sys.exit(f"bench_learner: --against imported sacbot from {other['sacbot']}, not {a.against}")
            res["against_on"].append(other["grad_steps_per_s"])
            line += f"  against quant-on {res['against_on'][-1]:.1f}"
        print(line + " steps/s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({"bench": "learner", "hidden": a.hidden, "batch": a.batch, "seq_len": a.seq_len,
                      "obs_dim": a.obs_dim, "act_dim": a.act_dim, "threads": a.threads, "rounds": a.rounds,
                      "median_steps_per_s": med, "runs": res,
                      "ratio_quant_on_vs_naive": round(med["on"] / med["naive"], 2),
                      "ratio_quant_off_vs_naive": round(med["off"] / med["naive"], 2),
                      # Each round's ratio pairs runs made a few seconds apart, so it is less
                      # exposed to the machine's slow drifts than the ratio of medians.
                      "median_round_ratio_on": round(statistics.median(
                          o / n for o, n in zip(res["on"], res["naive"], strict=True)), 2),
                      "median_round_ratio_off": round(statistics.median(
                          o / n for o, n in zip(res["off"], res["naive"], strict=True)), 2),
                      **({"median_round_ratio_on_vs_against": round(statistics.median(
                          o / n for o, n in zip(res["on"], res["against_on"], strict=True)), 2)}
                         if a.against else {})}))


if __name__ == "__main__":
    main()
