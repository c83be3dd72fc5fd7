#!/usr/bin/env python3
"""Learner capacity: samples/s per device and batch, and how many bots that serves.

samples/s = batch x sequence length x gradient steps/s (burn-in steps, which only warm the
LSTM state, are not counted).  Each measurement is a fresh
subprocess that builds the learner at the given sizes (tools/bench/learner.py's
``learner_and_batches``), warms it up (calibration included, so the timed updates
fake-quantize), then times for ``--seconds`` each:

* ``update``: ``learner.update`` on pre-sampled batches (what tools/bench/learner.py times);
* ``sample+update``: a fresh ``SequenceReplay.sample`` before every update, which is what the
  training thread really does per gradient step.

Rounds interleave every (device, threads, batch) so a drift of the shared machine hits all of
them; medians over rounds are reported, and on a GPU the ratio against the CPU learner measured
in the same run.  The scale model is the number of bots at ``--tick-hz`` one learner serves at
replay ratio R (samples trained per transition received): N = samples/s / (R x tick rate).

    python tools/bench/capacity.py --batches 16,64,256                       # the CPU table
    python tools/bench/capacity.py --devices cpu,cuda --batches 256,1024,4096 --cpu-batches 256,1024
    python tools/bench/capacity.py --devices cuda --batches 1024 --profile 1024   # kernels per update
    python tools/bench/capacity.py --batches 16 --burn-in 0,8 --rounds 5          # what burn-in costs

``--profile B`` runs once more after the rounds, on each GPU at batch B and the first
``--burn-in``: the two timed modes, then 10 updates under ``torch.profiler`` (which slows them).

The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _ints(text: str, least: int = 1) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < least:
        raise argparse.ArgumentTypeError(f"expected integers >= {least}, got {text!r}")
    return vals


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def child(a) -> dict:
    """One measurement, in its own process: update-only, then sample+update."""
    import numpy as np

    sys.path.insert(0, HERE)
    from learner import learner_and_batches

    learner, batches, replay = learner_and_batches(a, a.quant, 8)
    rng = np.random.default_rng(1)
    for i in range(5):
        learner.update(batches[i % 8])
    out = {"device": str(learner.device), "quant_phase": learner.quant_phase}
    for mode in ("update", "sample+update"):
        _sync(learner.device)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.seconds:
            batch = batches[n % 8] if mode == "update" else replay.sample(a.batch, a.seq_len, rng, a.burn_in)
            learner.update(batch)  # returns Python floats: the step has finished on the device
            n += 1
        dt = time.perf_counter() - t0
        out[mode] = round(n / dt, 3)
    if a.profile:
        try:
            out["profile"] = profile(learner, batches)
        except Exception as e:  # the profiler's event API moves between torch releases
            out["profile"] = {"error": repr(e)}
    return out


def profile(learner, batches, updates: int = 10) -> dict:
    """Kernels launched and device time per update, against its wall time: on a GPU, how far
    the update is from keeping the device busy."""
    import torch
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    _sync(learner.device)
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for i in range(updates):
            learner.update(batches[i % len(batches)])
        _sync(learner.device)
        wall = time.perf_counter() - t0
    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(ev.name, []).append(ev.time_range.elapsed_us())
    total_us = sum(sum(v) for v in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:8]
    return {"updates": updates, "wall_ms_per_update": round(1e3 * wall / updates, 2),
            "kernels_per_update": round(sum(len(v) for v in kernels.values()) / updates, 1),
            "device_ms_per_update": round(total_us / 1e3 / updates, 2),
            "device_busy": round(total_us / 1e6 / wall, 3) if wall > 0 else None,
            "top_kernels": [{"name": k[:80], "calls_per_update": round(len(v) / updates, 1),
                             "ms_per_update": round(sum(v) / 1e3 / updates, 3)} for k, v in top]}


def measure(a, device: str, threads: int, batch: int, burn_in: int, profile_it: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--devices", device, "--threads", str(threads),
           "--batches", str(batch), "--seq-len", str(a.seq_len), "--hidden", str(a.hidden),
           "--obs-dim", str(a.obs_dim), "--act-dim", str(a.act_dim), "--seconds", str(a.seconds),
           "--burn-in", str(burn_in),
           "--quant", a.quant] + (["--profile", str(batch)] if profile_it else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench_capacity: {device} batch {batch} failed (exit {out.returncode}):\n"
                           f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="cpu", help="comma-separated torch devices, e.g. cpu,cuda (default cpu)")
    p.add_argument("--batches", type=_ints, default=[16, 64, 256], help="batch sizes (default 16,64,256)")
    p.add_argument("--cpu-batches", type=_ints, default=None,
                   help="batch sizes for the CPU when it runs beside a GPU (default: --batches); the CPU "
                        "at batch 4096 takes seconds per step")
    p.add_argument("--threads", type=_ints, default=[1],
                   help="torch threads of the CPU learner, comma-separated (default 1, the learner's "
                        "torch_threads default); a GPU run uses 1")
    p.add_argument("--quant", choices=["on", "off"], default="on")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--burn-in", type=lambda t: _ints(t, 0), default=[0],
                   help="steps before each sequence that only warm the LSTM state (not counted in samples/s); "
                        "several, comma-separated, are measured in the same rounds (default 0)")
    p.add_argument("--obs-dim", type=int, default=35)
    p.add_argument("--act-dim", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per mode and measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replay-ratios", type=_ints, default=[512, 128, 32])
    p.add_argument("--tick-hz", type=float, default=30.0)
    p.add_argument("--profile", type=int, metavar="BATCH", default=0,
                   help="after the rounds, profile 10 updates at this batch on each GPU device")
    p.add_argument("--jsonl", metavar="PATH", help="append each measurement as a JSON line as it finishes")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.batch, a.device, a.threads, a.burn_in = a.batches[0], a.devices, a.threads[0], a.burn_in[0]
        print(json.dumps(child(a)))
        return
    if not (0 < a.seconds < math.inf) or a.rounds < 1 or not (0 < a.tick_hz < math.inf) or a.profile < 0:
        p.error("expected --seconds and --tick-hz finite and > 0, --rounds >= 1 and --profile >= 0")
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from sacbot.config import ConfigError
    from sacbot.learning.sac import resolve_device

    devices = []
    for name in dict.fromkeys(d.strip() for d in a.devices.split(",") if d.strip()):  # in order, once each
        try:  # one clear line before any run, not a child's traceback after some
            devices.append((name, resolve_device(name).type))
        except ConfigError as e:
            p.error(f"--devices: {e}")
    if not devices:
        p.error(f"--devices {a.devices!r} names no device; expected e.g. cpu or cpu,cuda")
    if a.jsonl:
        try:  # fail now, not after the first measurement
            open(a.jsonl, "a").close()
        except OSError as e:
            p.error(f"--jsonl {a.jsonl}: cannot append to it ({e.strerror})")
    plan = make_plan(devices, a)
    runs: dict[str, dict[str, list[float]]] = {k: {"update": [], "sample+update": []} for k, *_ in plan}
    for r in range(a.rounds):
        for key, dev, _, threads, batch, bi in plan:
            try:
                res = measure(a, dev, threads, batch, bi, False)
            except RuntimeError as e:
                sys.exit(str(e))
            for mode in ("update", "sample+update"):
                runs[key][mode].append(res[mode])
            if a.jsonl:
                with open(a.jsonl, "a") as f:
                    f.write(json.dumps({"round": r + 1, "key": key, **res}) + "\n")
            print(f"round {r + 1}/{a.rounds} {key}: {res['update']:.1f} steps/s update, "
                  f"{res['sample+update']:.1f} sample+update = "
                  f"{batch * a.seq_len * res['sample+update']:,.0f} samples/s", file=sys.stderr, flush=True)
    summary = summarize(plan, runs, a.seq_len, a.replay_ratios, a.tick_hz)
    profiles = {}
    if a.profile:
        for name, kind in devices:
            if kind != "cpu":  # on the CPU there are no kernels to count
                try:
                    profiles[name] = measure(a, name, 1, a.profile, a.burn_in[0], True)["profile"]
                except RuntimeError as e:  # keep the summary that the rounds measured
                    profiles[name] = {"error": str(e)[-500:]}
    print(json.dumps({"bench": "capacity", "quant": a.quant, "hidden": a.hidden, "seq_len": a.seq_len,
                      "burn_in": a.burn_in,
                      "obs_dim": a.obs_dim, "act_dim": a.act_dim, "rounds": a.rounds, "seconds": a.seconds,
                      "tick_hz": a.tick_hz, "summary": summary, "gpu_over_cpu": gpu_over_cpu(summary),
                      "profile": profiles, "runs": runs}))


def make_plan(devices: list[tuple[str, str]], a) -> list[tuple[str, str, str, int, int, int]]:
    """(key, device, kind, threads, batch, burn-in) of each measurement in a round; batches and
    thread counts once each, the CPU at --cpu-batches, a GPU at 1 thread."""
    plan = []
    tag = (lambda bi: f"/bi{bi}") if len(set(a.burn_in)) > 1 else (lambda bi: "")
    for bi in dict.fromkeys(a.burn_in):
        for name, kind in devices:
            if kind == "cpu":
                plan += [(f"{name}/t{t}/b{b}{tag(bi)}", name, kind, t, b, bi)
                         for t in dict.fromkeys(a.threads) for b in dict.fromkeys(a.cpu_batches or a.batches)]
            else:
                plan += [(f"{name}/b{b}{tag(bi)}", name, kind, 1, b, bi) for b in dict.fromkeys(a.batches)]
    return plan


def summarize(plan, runs, seq_len: int, replay_ratios: list[int], tick_hz: float) -> dict:
    """Per key: median steps/s of each mode, samples/s from them, and the bots served at each R."""
    summary = {}
    for key, dev, kind, threads, batch, bi in plan:
        med = {m: statistics.median(v) for m, v in runs[key].items()}
        samples = {m: round(batch * seq_len * v) for m, v in med.items()}
        summary[key] = {"device": dev, "kind": kind,
                        "threads": threads, "batch": batch, "burn_in": bi, "steps_per_s": med,
                        "samples_per_s": samples,
                        "bots_served": {str(R): round(samples["sample+update"] / (R * tick_hz), 1)
                                        for R in replay_ratios}}
    return summary


def gpu_over_cpu(summary: dict) -> dict:
    """Each GPU row's samples/s (with sampling) against the 1-thread CPU row of the same batch
    and burn-in, and against the best CPU row of the same burn-in."""
    rate = lambda row: row["samples_per_s"]["sample+update"]  # noqa: E731
    ratios = {}
    for key, row in summary.items():
        cpus = {k: c for k, c in summary.items() if c["kind"] == "cpu" and c["burn_in"] == row["burn_in"]}
        if row["kind"] == "cpu" or not cpus:
            continue
        same = [c for c in cpus.values() if c["batch"] == row["batch"] and c["threads"] == 1]
        best = max(cpus, key=lambda k: rate(cpus[k]))
        ratios[key] = {"vs_cpu_1_thread_same_batch": round(rate(row) / rate(same[0]), 2) if same else None,
                       "vs_best_cpu": round(rate(row) / rate(cpus[best]), 2), "best_cpu": best}
    return ratios


if __name__ == "__main__":
    main()
