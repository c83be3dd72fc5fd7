#!/usr/bin/env python3
"""How long the thread learner keeps the acting thread from running, and why.

A probe on the acting thread sleeps 1 ms, again and again, while the thread learner trains flat
out (UTD 8 on a stream of transitions that the probe itself sends).  Each wake-up is late by some
amount; the kernel's own count of the probe thread's run-queue time (``/proc/thread-self/
schedstat``) splits it in two:

- **cpu**: waiting for a core (the learner thread or another process was running);
- **gil**: the rest, which on an idle core is waiting for the GIL.

Arms alternate in one run (``--nice 0 10``: the learner at the bot's priority, then 10 lower), with
``--load`` CPU-bound processes beside it, so they meet the same machine.  Per arm: the delay
percentiles, the longest delay of each second of training (median and max over the seconds) for
each cause, and the learner's gradient steps per second.  Linux only.  Last line is JSON.

    python tools/bench/gil.py --seconds 20 --repeats 3 --load 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np
from benchlib import cpu_load, scratch_dir


def _run_delay_ns(fd: int) -> int:
    return int(os.pread(fd, 128, 0).split()[1])  # schedstat: on-cpu ns, run-queue ns, slices


def probe(nice: int, seconds: float, hidden: int) -> dict:
    """One arm: a fresh Agent whose thread learner runs at ``nice``; the probe on this thread."""
    from sacbot import Agent
    from sacbot.config import Config

    tmp = scratch_dir("sacbot-gil-")
    cfg = Config(hidden=hidden, learning_starts=64, utd_ratio=8.0, calib_updates=10, quiet=True,
                 learner="thread", learner_nice=nice, save_interval=10**9,
                 run_dir=os.path.join(tmp, "run"), weights_path=os.path.join(tmp, "w"))
    obs_dim = 35
    agent = Agent(cfg, gym.spaces.Box(-1, 1, (obs_dim,), np.float32), gym.spaces.Box(-1, 1, (4,), np.float32))
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (1024, obs_dim)).astype(np.float32)
    agent.new_episode("bench")

    def feed(i: int) -> None:
        agent.act(obs[i % 1024])
        agent.observe(0.0, obs[(i + 1) % 1024], False, i % 500 == 499)
        if i % 500 == 499:
            agent.new_episode("bench")

    for i in range(2000):  # past learning_starts and calibration: the learner is saturated
        feed(i)
    steps0 = agent.status().get("learner_steps", 0)
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    delays, cpu_parts, per_second = [], [], []
    second = {"max_ms": 0.0, "max_cpu_ms": 0.0, "max_gil_ms": 0.0}
    t_start = time.perf_counter()
    t_second = t_start
    i = 0
    try:
        while (now := time.perf_counter()) - t_start < seconds:
            if now - t_second >= 1.0:
                per_second.append(second)
                second = {"max_ms": 0.0, "max_cpu_ms": 0.0, "max_gil_ms": 0.0}
                t_second = now
            r0 = _run_delay_ns(fd)
            t0 = time.perf_counter_ns()
            time.sleep(0.001)
            late = time.perf_counter_ns() - t0 - 1_000_000
            cpu = min(max(_run_delay_ns(fd) - r0, 0), max(late, 0))
            delays.append(late)
            cpu_parts.append(cpu)
            second["max_ms"] = max(second["max_ms"], late / 1e6)
            second["max_cpu_ms"] = max(second["max_cpu_ms"], cpu / 1e6)
            second["max_gil_ms"] = max(second["max_gil_ms"], (late - cpu) / 1e6)
            feed(i)
            i += 1
        elapsed = time.perf_counter() - t_start
        st = agent.status()
    finally:
        os.close(fd)
        agent.close()
    d = np.asarray(delays, np.float64) / 1e3
    gil = (np.asarray(delays, np.float64) - np.asarray(cpu_parts, np.float64)) / 1e3

    def over_seconds(key: str) -> dict:
        xs = [s[key] for s in per_second] or [0.0]
        return {"median": round(float(np.median(xs)), 3), "max": round(float(max(xs)), 3)}

    return {"nice": nice, "learner_nice_measured": st.get("learner_nice"), "wakeups": len(d),
            "late_us": {"p50": round(float(np.percentile(d, 50)), 1), "p99": round(float(np.percentile(d, 99)), 1),
                        "p999": round(float(np.percentile(d, 99.9)), 1), "max": round(float(d.max()), 1)},
            "late_over_1ms_per_s": round(float((d > 1000).sum()) / elapsed, 2),
            "gil_part_us": {"p99": round(float(np.percentile(gil, 99)), 1),
                            "p999": round(float(np.percentile(gil, 99.9)), 1), "max": round(float(gil.max()), 1)},
            "longest_per_second_ms": {"all": over_seconds("max_ms"), "cpu": over_seconds("max_cpu_ms"),
                                      "gil": over_seconds("max_gil_ms")},
            "grad_steps_per_s": round((st.get("learner_steps", 0) - steps0) / elapsed, 1)}


def summarize(runs: list[dict]) -> dict:
    med = lambda xs: round(float(np.median(xs)), 2)  # noqa: E731
    return {"repeats": len(runs), "late_p99_us": med([r["late_us"]["p99"] for r in runs]),
            "late_p999_us": med([r["late_us"]["p999"] for r in runs]),
            "late_over_1ms_per_s": med([r["late_over_1ms_per_s"] for r in runs]),
            "longest_gil_wait_per_s_ms": med([r["longest_per_second_ms"]["gil"]["median"] for r in runs]),
            "longest_cpu_wait_per_s_ms": med([r["longest_per_second_ms"]["cpu"]["median"] for r in runs]),
            "grad_steps_per_s": med([r["grad_steps_per_s"] for r in runs])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="probe time per arm and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nice", type=int, nargs="+", default=[0, 10], help="learner_nice of each arm")
    p.add_argument("--load", type=int, default=1, help="CPU-bound processes running beside the bot")
    p.add_argument("--hidden", type=int, default=64)
    a = p.parse_args()
    if not os.path.exists("/proc/thread-self/schedstat"):
        sys.exit("bench_gil needs Linux's /proc/thread-self/schedstat (schedstats) to split the delay")
    runs: dict[int, list[dict]] = {n: [] for n in a.nice}
    with cpu_load(a.load):
        for r in range(a.repeats):
            for n in a.nice:  # alternate the arms, so drift in the machine hits both
                out = probe(n, a.seconds, a.hidden)
                runs[n].append(out)
                print(json.dumps({"repeat": r, **out}), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "gil", "load": a.load, "seconds": a.seconds, "hidden": a.hidden,
                      "arms": {str(n): summarize(rs) for n, rs in runs.items()}, "runs": runs}))


if __name__ == "__main__":
    main()
