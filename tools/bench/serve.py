#!/usr/bin/env python3
"""Round-trip time of one ``step`` through ``sacbot serve``, for the Python and the Java client, over
TCP on 127.0.0.1 and over a Unix socket, next to ``Agent.act`` in process.  A server process
(``sacbot serve``; each bot's thread learner trains flat out once ``learning_starts`` transitions
are in: the learner saturated) and a game that steps back to back: one episode of ``--warmup``
then ``--ticks`` timed steps per arm, each arm its own bot.  The reference arm is an Agent in this
process with its own thread learner, timed on ``act()`` alone.  The server runs one learner that
every arm's bot feeds (``--shared-learner``), so one learner is saturated throughout, not one more
per arm; with ``--learner process`` each arm's bot has its own learner process instead, in a server of
its own (the server's process then holds no learner thread, and no arm plays beside the learners of
the arms before it: a bot stays loaded, training, after its game closes).  Last line is JSON.

    python tools/bench/serve.py --ticks 100000 --warmup 1500
    python tools/bench/serve.py --ticks 100000 --load 2     # and 2 busy processes: every core taken
    python tools/bench/serve.py --ticks 100000 --load 2 --load-nice 10   # ... at the learner's priority
    python tools/bench/serve.py --ticks 100000 --learner process

The Java arms need javac and Debian's msgpack-core jar (./tools/setup.sh java); without them they
are left out and the JSON says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
from benchlib import ServeProcess, cpu_load

from sacbot.serve.client import SacbotClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pct(ns: list[int]) -> dict:
    a = np.asarray(ns, np.float64) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "p999_us": round(float(np.percentile(a, 99.9)), 1), "max_us": round(float(a.max()), 1), "n": len(a)}


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


def in_process(args, tmp: str) -> dict:
    """``Agent.act`` timed in this process, its own thread learner training on what it observes."""
    import gymnasium as gym

    from sacbot import Agent, Config

    obs_space = gym.spaces.Box(-1.0, 1.0, (args.obs_dim,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (args.act_dim,), np.float32)
    cfg = Config(env="external", weights_path=os.path.join(tmp, "agent", "w"), run_dir=os.path.join(tmp, "agent", "r"),
                 quiet=True, pace="free")
    rng = np.random.default_rng(0)
    times = []
    with Agent(cfg, obs_space, act_space) as agent:
        agent.new_episode("bench")
        obs = np.zeros(args.obs_dim, np.float32)
        for k in range(args.warmup + args.ticks):
            t0 = time.perf_counter_ns()
            a = agent.act(obs)
            if k >= args.warmup:
                times.append(time.perf_counter_ns() - t0)
            nxt = rng.uniform(-1, 1, args.obs_dim).astype(np.float32)
            agent.observe(float(-abs(a[0])), nxt, False, False)
            obs = nxt
    return pct(times)


def java_classes(tmp: str) -> str | None:
    """The Java client and its bench compiled into ``tmp``; the classpath, or None without Java."""
    jars = sorted(glob.glob("/usr/share/java/msgpack-core*.jar"))
    if not (jars and shutil.which("javac") and shutil.which("java")):
        return None
    out = os.path.join(tmp, "classes")
    src = sorted(glob.glob(os.path.join(ROOT, "clients", "java", "sacbot", "*.java")))
    subprocess.run(["javac", "-cp", jars[0], "-d", out, *src], check=True, capture_output=True, timeout=300)
    return f"{out}{os.pathsep}{jars[0]}"


def run_arm(arm: str, server: ServeProcess, cp: str | None, args, results: dict) -> None:
    lang, _, transport = arm.partition("-")
    obs = {"shape": [args.obs_dim], "low": -1.0, "high": 1.0}
    act = {"shape": [args.act_dim], "low": -1.0, "high": 1.0}
    where = {"port": server.port} if transport == "tcp" else {"socket_path": server.socket}
    if lang == "python":
        with SacbotClient(f"bench-{arm}", obs, act, **where) as c:
            results[arm] = measure(c, args.obs_dim, args.warmup, args.ticks, seed=0)
    elif lang == "java":
        if cp is None:
            results[arm] = "skipped: no javac or msgpack-core jar (./tools/setup.sh java)"
        else:
            flag = ["--port", str(server.port)] if transport == "tcp" else ["--socket", str(server.socket)]
            r = subprocess.run(["java", *args.java_opts.split(), "-cp", cp, "sacbot.Bench", *flag,
                                "--ticks", str(args.ticks), "--warmup", str(args.warmup),
                                "--obs-dim", str(args.obs_dim), "--act-dim", str(args.act_dim),
                                "--bot", f"bench-{arm}"],
                               capture_output=True, text=True, timeout=3600)
            if r.returncode != 0:
                raise SystemExit(f"the Java bench failed: {r.stderr[-2000:]}")
            results[arm] = json.loads(r.stdout.strip().splitlines()[-1])
    else:
        return
    print(f"{arm}: {results[arm]}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ticks", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=1500, help="steps before measuring (the learner starts at 1000)")
    p.add_argument("--obs-dim", type=int, default=35, help="TankDuel's observation size")
    p.add_argument("--act-dim", type=int, default=2)
    p.add_argument("--load", type=int, default=0, help="busy processes beside the server and the game")
    p.add_argument("--load-nice", type=int, default=0,
                   help="the niceness the busy processes add to their own (default 0; the learner's own "
                        "learner_nice, 10, makes them stand for more of the bot's own learning)")
    p.add_argument("--java-opts", default="", help="options for the Java arms' JVM, e.g. -XX:+UseSerialGC")
    p.add_argument("--arms", default="agent,python-tcp,python-unix,java-tcp,java-unix")
    p.add_argument("--learner", choices=("shared", "process"), default="shared",
                   help="shared: one thread learner in the server that every arm's bot feeds (default); process: "
                        "each arm's bot its own learner process")
    args, server_args = p.parse_known_args()
    if not 0 <= args.load_nice <= 19:
        p.error(f"--load-nice {args.load_nice}: expected 0 to 19 (a process may lower its own priority only)")
    arms = args.arms.split(",")
    results: dict = {}
    with cpu_load(args.load, args.load_nice), tempfile.TemporaryDirectory() as tmp:
        if "agent" in arms:
            results["agent_act_in_process"] = in_process(args, tmp)
            print(f"agent.act in process: {results['agent_act_in_process']}", flush=True)
        cp = java_classes(tmp) if any(a.startswith("java") for a in arms) else None
        if args.learner == "shared":
            with ServeProcess(os.path.join(tmp, "root"), ["--shared-learner", *server_args],
                              socket=os.path.join(tmp, "serve.sock")) as server:
                for arm in arms:
                    run_arm(arm, server, cp, args, results)
        else:
            # A bot stays loaded, its learner training, after its game closes: a server per arm,
            # so that every arm plays beside one learner, not beside those of the arms before it.
            for arm in arms:
                if arm != "agent":
                    with ServeProcess(os.path.join(tmp, f"root-{arm}"), ["--learner", "process", *server_args],
                                      socket=os.path.join(tmp, f"serve-{arm}.sock")) as server:
                        run_arm(arm, server, cp, args, results)
    print(json.dumps({"ticks": args.ticks, "warmup": args.warmup, "obs_dim": args.obs_dim, "load": args.load,
                      "load_nice": args.load_nice, "java_opts": args.java_opts,
                      "learner": args.learner,
                      "cpus": os.cpu_count(), **results}))


if __name__ == "__main__":
    main()
