#!/usr/bin/env python3
"""Round-trip time of one ``step`` through ``sacbot serve``: a server process (``sacbot serve``, the
thread learner training once ``learning_starts`` transitions are in) and the Python client in this
process, over TCP on 127.0.0.1 and over a Unix socket.  A game that steps back to back, one
episode of ``--ticks`` steps per transport after ``--warmup`` steps.  Last line is JSON.

    python tools/bench/serve.py --ticks 5000 --warmup 1500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from sacbot.serve.client import SacbotClient


def pct(ns: list[int]) -> dict:
    a = np.asarray(ns, np.float64) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "max_us": round(float(a.max()), 1), "n": len(a)}


def measure(client: SacbotClient, obs_dim: int, warmup: int, ticks: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    client.new_episode("bench")
    obs, reward, times = np.zeros(obs_dim), None, []
    t_start = time.perf_counter()
    for k in range(warmup + ticks):
        if k == warmup:
            t_start = time.perf_counter()
        t0 = time.perf_counter_ns()
        a = client.step(obs, reward)
        if k >= warmup:
            times.append(time.perf_counter_ns() - t0)
        obs, reward = rng.uniform(-1, 1, obs_dim), float(-abs(a[0]))
    out = {**pct(times), "steps_per_s": round(ticks / (time.perf_counter() - t_start), 1)}
    client.step(obs, reward, truncated=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ticks", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=1500, help="steps before measuring (the learner starts at 1000)")
    p.add_argument("--obs-dim", type=int, default=35, help="TankDuel's observation size")
    p.add_argument("--act-dim", type=int, default=2)
    args, server_args = p.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "serve.sock")
        server = subprocess.Popen([sys.executable, "-m", "sacbot", "serve", "--root", os.path.join(tmp, "root"),
                                   "--port", "0", "--socket", sock, *server_args],
                                  stderr=subprocess.PIPE, text=True)
        try:
            port = None
            for line in server.stderr:  # the server's own "listening" line gives the port it bound
                if "listening on tcp 127.0.0.1:" in line:
                    port = int(line.split("127.0.0.1:")[1].split()[0].rstrip(","))
                    break
            if port is None:
                raise SystemExit("the server did not start")
            obs = {"shape": [args.obs_dim], "low": -1.0, "high": 1.0}
            act = {"shape": [args.act_dim], "low": -1.0, "high": 1.0}
            results = {}
            for name, where in (("tcp", {"port": port}), ("unix", {"socket_path": sock})):
                with SacbotClient(f"bench-{name}", obs, act, **where) as c:
                    results[name] = measure(c, args.obs_dim, args.warmup, args.ticks, seed=0)
                print(f"{name}: {results[name]}", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=120)
    print(json.dumps({"ticks": args.ticks, "warmup": args.warmup, "obs_dim": args.obs_dim, **results}))


if __name__ == "__main__":
    main()
