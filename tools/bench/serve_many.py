#!/usr/bin/env python3
"""Many games at once on one ``sacbot serve``: ``--clients`` Python clients, each a thread of this
process (or, with ``--games-as processes``, a process of its own) playing at ``--tps`` ticks a second on a
fixed clock for ``--seconds``, each its own bot.
Reports, per the whole run: steps sent and answered (a step with no answer is a dropped step), how
late each answer came after its tick's start (over 5 ms counts as late) and, apart, each step's
round trip from send to answer, the transitions the
server's learner(s) had no room for, and the server's resident memory over time (flat or growing).
Server flags after the tool's own go to ``sacbot serve`` (``--shared-learner``, say).  Last line is JSON.

Each game keeps its own clock.  ``--phases random`` (the default) starts each clock at a random
offset within one tick, as separate games would; ``--phases aligned`` ticks all of them at the same
instant, the worst case: 32 steps arrive together every tick and the last one waits for the other 31.
The memory reported is the server's and its children's (process learners) together, and the
server's own apart.

``--floor`` then plays the same games against a yardstick server that answers at once from one
selector loop, with no bot behind it: what the machine and this harness cost on their own.

    python tools/bench/serve_many.py --clients 32 --tps 30 --seconds 600 --floor --shared-learner --learner process
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time

import numpy as np
from benchlib import ServeProcess

from sacbot.serve.client import SacbotClient

LATE_MS = 5.0


def rss_mb(pid: int, children: bool = True) -> float:
    """Resident memory of ``pid`` and (``children``) its descendants: a process learner is a child of the server."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024
            # A child is listed under the thread that started it.
            for task in os.listdir(f"/proc/{p}/task") if children else ():
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, StopIteration):  # gone meanwhile, or a zombie without VmRSS
            pass
    return total


def game(name: str, where: dict, tps: float, seconds: float, episode: int, out: dict, start: float) -> None:
    """One game on a fixed clock; ``out[name]``: steps sent, and for each answered step how late its
    answer came after the tick's start and its round trip from send to answer (ms)."""
    obs_space = {"shape": [35], "low": -1.0, "high": 1.0}
    act_space = {"shape": [2], "low": -1.0, "high": 1.0}
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    sent, lateness, trips = 0, [], []
    try:
        with SacbotClient(name, obs_space, act_space, timeout=30, hello_timeout=300, **where) as c:
            k = 0
            period = 1.0 / tps
            # A game whose hello came back after the common start (the server was loading a bot or
            # its learner) starts its clock now: the load is not any tick's lateness.
            start = t_next = max(time.monotonic(), start)
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
                    t_sent = time.monotonic()
                    a = c.step(obs, reward, truncated=last)
                    t_done = time.monotonic()
                    lateness.append((t_done - t_next) * 1e3)
                    trips.append((t_done - t_sent) * 1e3)
                    k += 1
                    t_next = start + k * period  # a fixed clock: a game that falls behind stays late
                    if last:
                        assert a is None
                        break
                    obs, reward = rng.uniform(-1, 1, 35), float(-abs(a[0]))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other games go on
        out[name] = {"error": f"{type(e).__name__}: {e}", "sent": sent, "lateness_ms": lateness, "trip_ms": trips}
        return
    out[name] = {"sent": sent, "lateness_ms": lateness, "trip_ms": trips}


def game_process(name: str, where: dict, tps: float, seconds: float, episode: int, results, start: float) -> None:
    """One game in a process of its own: ``game``, its result put on ``results``."""
    out: dict = {}
    game(name, where, tps, seconds, episode, out, start)
    results.put(out)


def play(args, port: int, server_pid: int | None) -> tuple[dict, list]:
    """Every game against the server on ``port``, to the end; their results by name, and the
    server's memory over time (when ``server_pid`` is given)."""
    out: dict = {}
    # Every game connects, then each starts its own clock (time.monotonic is one clock for every
    # process of the machine); a game process needs a fraction of a second of CPU to start.
    threads = args.games_as == "threads"
    start = time.monotonic() + (2.0 + 0.1 * args.clients if threads else 3.0 + 0.3 * args.clients)
    offsets = (np.random.default_rng(args.seed).uniform(0, 1 / args.tps, args.clients)
               if args.phases == "random" else np.zeros(args.clients))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    clock = (args.tps, args.seconds, args.episode)
    if threads:
        games = [threading.Thread(target=game, args=(f"g{i:02d}", {"port": port}, *clock, out,
                                                     start + float(offsets[i])), name=f"game-{i}")
                 for i in range(args.clients)]
    else:
        games = [ctx.Process(target=game_process, args=(f"g{i:02d}", {"port": port}, *clock, results,
                                                        start + float(offsets[i])), name=f"game-{i}")
                 for i in range(args.clients)]
    for g in games:
        g.start()
    memory = []
    while any(g.is_alive() for g in games) or len(out) < args.clients:
        while not threads and not results.empty():
            out.update(results.get())  # read as they come: a process exits only once its result is out
        if server_pid is not None:
            memory.append((round(time.monotonic() - start, 1), round(rss_mb(server_pid), 1),
                           round(rss_mb(server_pid, children=False), 1)))
        time.sleep(min(10.0, max(1.0, args.seconds / 60)))
    for g in games:
        g.join()
    return out, memory


def summary(games: list[dict]) -> dict:
    """What the games saw: steps, lateness, round trips."""
    late = [x for g in games for x in g["lateness_ms"]]
    trips = [x for g in games for x in g["trip_ms"]]
    errors = [g for g in games if "error" in g]
    sent = sum(g["sent"] for g in games)
    return {"steps_sent": sent, "steps_answered": len(late), "dropped_steps": sent - len(late),
            "games_failed": len(errors), "first_error": errors[0]["error"] if errors else None,
            "late_over_5ms": sum(x > LATE_MS for x in late),
            "worst_ms": round(max(late, default=0.0), 2),
            "p99_ms_worst_game": max((round(float(np.percentile(g["lateness_ms"], 99)), 2)
                                      for g in games if g["lateness_ms"]), default=0),
            # The round trip alone, from send to answer: a late tick whose trip was short was late
            # before it was sent (the game's own thread woke late on the busy cores).
            "round_trips_over_5ms": sum(x > LATE_MS for x in trips),
            "round_trip_ms_p50_p99_p999_max": [round(float(x), 2) for x in (
                np.percentile(trips, [50, 99, 99.9]).tolist() + [max(trips)])] if trips else None}


def minute_rss(memory: list, column: int, last: bool, seconds: float) -> float | None:
    """The median of one memory column over the run's first (or last) minute."""
    got = [row[column] for row in memory if (row[0] >= seconds - 60 if last else row[0] <= 60)]
    return round(float(np.median(got)), 1) if got else None


def floor_server(ports) -> None:
    """The yardstick's server (a process of its own): hello, new_episode, step and close answered at
    once, from one selector loop, with no bot, act or learner behind them."""
    import selectors
    import socket
    import struct

    import msgpack

    header = struct.Struct(">I")  # the protocol's frame: a 4-byte big-endian length, then msgpack
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    ports.put(listener.getsockname()[1])
    pending: dict = {}
    while True:
        for key, _ in sel.select():
            if key.data is None:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ, "game")
                continue
            conn = key.fileobj
            data = conn.recv(1 << 16)
            if not data:
                sel.unregister(conn)
                conn.close()
                continue
            buf = pending[conn] + data
            while len(buf) >= 4 and len(buf) >= 4 + (n := header.unpack(buf[:4])[0]):
                msg, buf = msgpack.unpackb(buf[4:4 + n]), buf[4 + n:]
                kind = msg["type"]
                if kind == "hello":
                    reply = {"type": "welcome", "version": 1, "bot": msg["bot"], "ticks": 0, "episodes": 0}
                elif kind == "new_episode":
                    reply = {"type": "ok", "episode": 0}
                elif kind == "step":
                    done = msg["terminated"] or msg["truncated"]
                    reply = {"type": "action", "action": None if done else [0.0] * 2, "done": done}
                else:
                    reply = {"type": "bye"}
                body = msgpack.packb(reply)
                conn.sendall(header.pack(len(body)) + body)  # a few bytes: the socket's buffer takes them
            pending[conn] = buf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--tps", type=float, default=30.0)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--episode", type=int, default=600, help="ticks per episode")
    p.add_argument("--phases", choices=["random", "aligned"], default="random",
                   help="each game's clock starts at a random offset within a tick, or all tick together")
    p.add_argument("--seed", type=int, default=0, help="seeds the random phases")
    p.add_argument("--games-as", choices=["threads", "processes"], default="threads",
                   help="all games threads of this process (default; they share its GIL), or each game a process "
                        "of its own, as separate games are")
    p.add_argument("--floor", action="store_true",
                   help="then the same games against a yardstick: a server with no bot behind it that answers "
                        "each message at once from one selector loop (the machine's and the harness's share)")
    args, server_args = p.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        flags = ["--max-bots", str(args.clients), "--max-connections", str(args.clients + 8), *server_args]
        with ServeProcess(root, flags, stop_timeout=300) as server:
            out, memory = play(args, server.port, server.proc.pid)
            with open(os.path.join(root, "status.json")) as fh:
                status = json.load(fh)
    floor = None
    if args.floor:
        ctx = multiprocessing.get_context("spawn")
        ports = ctx.Queue()
        yardstick = ctx.Process(target=floor_server, args=(ports,), name="floor-server", daemon=True)
        yardstick.start()
        try:
            got, _ = play(args, ports.get(timeout=60), None)
        finally:
            yardstick.terminate()
            yardstick.join(10)
        floor = summary(list(got.values()))
    learned = status.get("shared_learner") or {}
    drops = sum((b.get("drops") or {}).get("transition", 0) for b in status["bots"].values())
    result = {"clients": args.clients, "tps": args.tps, "seconds": args.seconds, "phases": args.phases,
              "games_as": args.games_as, "server_args": server_args, **summary(list(out.values())),
              "transitions_dropped_at_learner_queues": drops,
              "learner_transitions_received": learned.get("env_steps_received"),
              "rss_mb_first_minute": minute_rss(memory, 1, False, args.seconds),
              "rss_mb_last_minute": minute_rss(memory, 1, True, args.seconds),
              "rss_mb_max": max(m for _, m, _ in memory) if memory else None,
              # The server's own process, without its learner processes (whose replay fills by design).
              "server_rss_mb_first_minute": minute_rss(memory, 2, False, args.seconds),
              "server_rss_mb_last_minute": minute_rss(memory, 2, True, args.seconds),
              "floor": floor}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
