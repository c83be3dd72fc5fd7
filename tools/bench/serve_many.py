#!/usr/bin/env python3
"""Many games at once on one ``sacbot serve``: ``--clients`` Python clients, each a thread of this
process playing at ``--tps`` ticks a second on a fixed clock for ``--seconds``, each its own bot.
Reports, per the whole run: steps sent and answered (a step with no answer is a dropped step), how
late each answer came after its tick's start (over 5 ms counts as late), the transitions the
server's learner(s) had no room for, and the server's resident memory over time (flat or growing).
Server flags after the tool's own go to ``sacbot serve`` (``--shared-learner``, say).  Last line is JSON.

    python tools/bench/serve_many.py --clients 32 --tps 30 --seconds 600 --shared-learner
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

import numpy as np
from benchlib import ServeProcess

from sacbot.serve.client import SacbotClient

LATE_MS = 5.0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def game(name: str, where: dict, tps: float, seconds: float, episode: int, out: dict, start: float) -> None:
    obs_space = {"shape": [35], "low": -1.0, "high": 1.0}
    act_space = {"shape": [2], "low": -1.0, "high": 1.0}
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    sent = answered = late = 0
    worst, lateness = 0.0, []
    try:
        with SacbotClient(name, obs_space, act_space, timeout=30, hello_timeout=300, **where) as c:
            k = 0
            period = 1.0 / tps
            t_next = max(time.monotonic(), start)
            end = start + seconds
            while t_next < end:
                c.new_episode("bench")
                obs, reward = np.zeros(35), None
                for t in range(episode):
                    now = time.monotonic()
                    if now < t_next:
                        time.sleep(t_next - now)
                    last = t == episode - 1 or t_next + period >= end
                    sent += 1
                    a = c.step(obs, reward, truncated=last)
                    done_ms = (time.monotonic() - t_next) * 1e3
                    answered += 1
                    lateness.append(done_ms)
                    worst = max(worst, done_ms)
                    late += done_ms > LATE_MS
                    k += 1
                    t_next = start + k * period  # a fixed clock: a game that falls behind stays late
                    if last:
                        assert a is None
                        break
                    obs, reward = rng.uniform(-1, 1, 35), float(-abs(a[0]))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other games go on
        out[name] = {"error": f"{type(e).__name__}: {e}", "sent": sent, "answered": answered}
        return
    out[name] = {"sent": sent, "answered": answered, "late": late, "worst_ms": round(worst, 2),
                 "p99_ms": round(float(np.percentile(lateness, 99)), 2) if lateness else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--tps", type=float, default=30.0)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--episode", type=int, default=600, help="ticks per episode")
    args, server_args = p.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        flags = ["--max-bots", str(args.clients), "--max-connections", str(args.clients + 8), *server_args]
        with ServeProcess(root, flags, stop_timeout=300) as server:
            out: dict = {}
            start = time.monotonic() + 5.0  # every game connects, then all start on one clock
            threads = [threading.Thread(target=game, args=(f"g{i:02d}", {"port": server.port}, args.tps,
                                                            args.seconds, args.episode, out, start), name=f"game-{i}")
                       for i in range(args.clients)]
            for t in threads:
                t.start()
            memory = []
            while any(t.is_alive() for t in threads):
                memory.append((round(time.monotonic() - start, 1), round(rss_mb(server.proc.pid), 1)))
                time.sleep(min(10.0, max(1.0, args.seconds / 60)))
            for t in threads:
                t.join()
            with open(os.path.join(root, "status.json")) as fh:
                status = json.load(fh)
    games = list(out.values())
    errors = [g for g in games if "error" in g]
    sent, answered = sum(g["sent"] for g in games), sum(g["answered"] for g in games)
    late = sum(g.get("late", 0) for g in games)
    learned = status.get("shared_learner") or {}
    drops = sum((b.get("drops") or {}).get("transition", 0) for b in status["bots"].values())
    first = [m for t, m in memory if t <= 60]
    last = [m for t, m in memory if t >= args.seconds - 60]
    result = {"clients": args.clients, "tps": args.tps, "seconds": args.seconds, "server_args": server_args,
              "steps_sent": sent, "steps_answered": answered, "dropped_steps": sent - answered,
              "games_failed": len(errors), "first_error": errors[0]["error"] if errors else None,
              "late_over_5ms": late, "worst_ms": max((g.get("worst_ms") or 0) for g in games),
              "p99_ms_worst_game": max((g.get("p99_ms") or 0) for g in games),
              "transitions_dropped_at_learner_queues": drops,
              "learner_transitions_received": learned.get("env_steps_received"),
              "rss_mb_first_minute": round(float(np.median(first)), 1) if first else None,
              "rss_mb_last_minute": round(float(np.median(last)), 1) if last else None,
              "rss_mb_max": max(m for _, m in memory) if memory else None}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
