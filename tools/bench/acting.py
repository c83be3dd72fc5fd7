#!/usr/bin/env python3
"""act() latency, idle and with the learner saturated, beside a torch policy on the acting thread.

The learner is a real training thread at full speed (UTD 8 on a stream of transitions).
Also measured: snapshot lock hold times, policy lag in versions, and deadline misses in
realtime pace at 30 and 200 ticks/s.  Last line is JSON.

    python tools/bench/acting.py --calls 20000 --ticks 3000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from benchlib import cpu_load, scratch_dir


def pct(xs_ns) -> dict:
    a = np.asarray(xs_ns, dtype=np.float64) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "p999_us": round(float(np.percentile(a, 99.9)), 1), "max_us": round(float(a.max()), 1), "n": len(a)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--ticks", type=int, default=3000, help="realtime ticks per rate (the goal asks >= 100k)")
    p.add_argument("--obs-dim", type=int, default=35)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--rates", type=int, nargs="+", default=[30, 200], help="realtime ticks per second to test")
    p.add_argument("--learner-nice", type=int, default=None, help="the learner's niceness (default: the config's)")
    p.add_argument("--load", type=int, default=0, help="CPU-bound processes running beside the bot")
    a = p.parse_args()
    with cpu_load(a.load):
        bench(a)


def bench(a: argparse.Namespace) -> None:

    from sacbot import Agent
    from sacbot.config import Config

    tmp = scratch_dir("sacbot-bench-")
    cfg = Config(hidden=a.hidden, learning_starts=64, utd_ratio=8.0, calib_updates=10, quiet=True,
                 run_dir=os.path.join(tmp, "run"), weights_path=os.path.join(tmp, "w"), save_interval=10**9,
                 **({} if a.learner_nice is None else {"learner_nice": a.learner_nice}))
    obs_space = gym.spaces.Box(-1, 1, (a.obs_dim,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    agent = Agent(cfg, obs_space, act_space)
    agent.learning_starts_left = 0  # measure the policy, not the uniform warm-up
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (1024, a.obs_dim)).astype(np.float32)

    def act_loop(n, send: bool):
        lat = []
        agent.new_episode("bench")
        for i in range(n):
            o = obs[i % 1024]
            t0 = time.perf_counter_ns()
            agent.act(o)
            lat.append(time.perf_counter_ns() - t0)
            if send:
                agent.observe(0.0, obs[(i + 1) % 1024], False, i % 500 == 499)
                if i % 500 == 499:
                    agent.new_episode("bench")
            else:
                agent._last_obs = None
        return lat

    idle = act_loop(a.calls, send=False)
    # saturate: stream transitions until the learner is busy, then measure
    act_loop(2000, send=True)
    sat = act_loop(a.calls, send=True)
    lags = []
    for i in range(2000):
        agent.act(obs[i % 1024])
        agent.observe(0.0, obs[(i + 1) % 1024], False, False)
        lags.append(agent.learner.snapshot.version - agent.policy_version)
    # Lock hold of publish and pull, with the learner's real export (quantized layout),
    # while the training thread keeps running.
    from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot

    export = agent.learner.loop.state.learner.export_actor()
    snap, publish_holds, pull_holds = WeightSnapshot(), [], []
    reader = SnapshotReader(snap)
    snap.publish(export)
    for _ in range(2000):
        snap.publish(export)
        publish_holds.append(snap.last_publish_hold_s * 1e9)
        reader.pull()
        pull_holds.append(snap.last_pull_hold_s * 1e9)

    # torch policy on the acting thread, same load
    torch.set_num_threads(1)
    actor = agent.learner.loop.state.learner.actor
    tlat = []
    hc = None
    prev = torch.zeros(1, 1, 4)
    for i in range(min(a.calls, 5000)):
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            mu, _, hc = actor(torch.as_tensor(obs[i % 1024]).view(1, 1, -1), prev, hc)
            prev = torch.tanh(mu)
            prev.numpy()
        tlat.append(time.perf_counter_ns() - t0)
        agent.act(obs[i % 1024])
        agent.observe(0.0, obs[(i + 1) % 1024], False, False)

    realtime = {}
    for tps in a.rates:
        period = 1.0 / tps
        misses = 0
        next_tick = time.perf_counter()
        for i in range(a.ticks):
            now = time.perf_counter()
            if now > next_tick + period:
                misses += 1
                next_tick = now
            else:
                time.sleep(max(0.0, next_tick - now))
            next_tick += period
            agent.act(obs[i % 1024])
            agent.observe(0.0, obs[(i + 1) % 1024], False, False)
        realtime[f"{tps}tps"] = {"ticks": a.ticks, "misses": misses, "miss_rate": misses / a.ticks,
                                 "drops": agent.learner.drops()}
        print(json.dumps({"realtime": tps, **realtime[f"{tps}tps"]}), file=sys.stderr, flush=True)
    learner_steps = agent.status()["learner_steps"]
    agent.close()
    print(json.dumps({"bench": "acting", "hidden": a.hidden, "obs_dim": a.obs_dim, "load": a.load,
                      "learner_nice": cfg.learner_nice,
                      "act_idle": pct(idle), "act_saturated": pct(sat), "torch_policy_saturated": pct(tlat),
                      "publish_hold": pct(publish_holds), "pull_hold": pct(pull_holds),
                      "policy_lag_versions": {"median": float(np.median(lags)), "max": int(max(lags))},
                      "realtime": realtime, "learner_steps_during_bench": learner_steps}))


if __name__ == "__main__":
    main()
