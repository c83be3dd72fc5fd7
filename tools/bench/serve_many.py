#!/usr/bin/env python3
"""Many games at once on one ``sacbot serve``: ``--clients`` Python clients, each a thread of this
process (or, with ``--games-as processes``, a process of its own; with ``--games-as loop``, all of them
driven by one thread's selector loop) playing at ``--tps`` ticks a second on a fixed clock for
``--seconds``, each its own bot.
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
from sacbot.serve.protocol import FrameBuffer, decode_body, encode_frame

LATE_MS = 5.0
OBS_SPACE = {"shape": [35], "low": -1.0, "high": 1.0}
ACT_SPACE = {"shape": [2], "low": -1.0, "high": 1.0}
OBS_DIM = OBS_SPACE["shape"][0]


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
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    sent, lateness, trips = 0, [], []
    try:
        with SacbotClient(name, OBS_SPACE, ACT_SPACE, timeout=30, hello_timeout=300, **where) as c:
            k = 0
            period = 1.0 / tps
            # A game whose hello came back after the common start (the server was loading a bot or
            # its learner) starts its clock now: the load is not any tick's lateness.
            start = t_next = max(time.monotonic(), start)
            end = start + seconds
            while t_next < end:
                c.new_episode("bench")
                obs, reward = np.zeros(OBS_DIM), None
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
                    obs, reward = rng.uniform(-1, 1, OBS_DIM), float(-abs(a[0]))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other games go on
        out[name] = {"error": f"{type(e).__name__}: {e}", "sent": sent, "lateness_ms": lateness, "trip_ms": trips}
        return
    out[name] = {"sent": sent, "lateness_ms": lateness, "trip_ms": trips}


def game_loop(names: list[str], port: int, tps: float, seconds: float, episode: int, out: dict,
              starts: list[float]) -> None:
    """Every game driven by this one thread: the same clocks, messages and measures as ``game``, with
    the sockets on one selector loop, so that the harness adds one runnable thread, not one a game.
    A tick is sent when its time comes or, for a game still waiting for its last answer, as soon as
    that answer arrives; either way its lateness runs from its scheduled start."""
    import heapq
    import selectors

    period = 1.0 / tps
    clients = [SacbotClient(name, OBS_SPACE, ACT_SPACE, port=port, timeout=30, hello_timeout=300) for name in names]
    for c in clients:
        c.connect()  # hello, one game after another: a bot loads on the server meanwhile
    # A clock whose start passed while the hellos ran starts after the last hello, keeping its phase.
    late_by = max(0.0, time.monotonic() - min(starts))
    sel = selectors.DefaultSelector()
    games, due = [], []
    for i, (name, c) in enumerate(zip(names, clients, strict=True)):
        sock = c._sock  # the client's own socket after its hello: the bench reads and writes it without blocking
        assert sock is not None
        sock.setblocking(False)
        start = starts[i] + late_by
        g = {"name": name, "sock": sock, "buf": FrameBuffer(), "start": start, "end": start + seconds, "k": 0,
             "t": 0, "tick_at": 0.0, "sent_at": 0.0, "last": False, "obs": np.zeros(OBS_DIM), "reward": None,
             "rng": np.random.default_rng(abs(hash(name)) % (1 << 32)), "sent": 0, "lateness_ms": [],
             "trip_ms": [], "error": None}
        games.append(g)
        sel.register(sock, selectors.EVENT_READ, i)
        sock.sendall(encode_frame({"type": "new_episode", "opponent": "bench"}))

    def tick_time(g: dict, k: int) -> float:
        return g["start"] + k * period  # a fixed clock: a game that falls behind stays late

    def fail(g: dict, why: str) -> None:
        g["error"] = why
        sel.unregister(g["sock"])

    def send_step(g: dict, tick_at: float) -> None:
        g["last"] = g["t"] == episode - 1 or tick_time(g, g["k"] + 1) >= g["end"]
        g["tick_at"], g["sent_at"] = tick_at, time.monotonic()
        g["sent"] += 1
        # A frame of a few hundred bytes: the socket's buffer takes it whole, so sendall does not block.
        g["sock"].sendall(encode_frame({"type": "step", "obs": g["obs"].tolist(), "reward": g["reward"],
                                        "terminated": False, "truncated": g["last"]}))

    def answered(i: int, reply: dict) -> None:
        g = games[i]
        now = time.monotonic()
        if reply["type"] == "ok":  # a new episode: its first tick when its time comes
            g["t"], g["obs"], g["reward"] = 0, np.zeros(OBS_DIM), None
            heapq.heappush(due, (tick_time(g, g["k"]), i))
            return
        if reply["type"] != "action":
            fail(g, f"the server answered {reply}")
            return
        g["lateness_ms"].append((now - g["tick_at"]) * 1e3)
        g["trip_ms"].append((now - g["sent_at"]) * 1e3)
        g["k"] += 1
        g["t"] += 1
        if g["last"]:
            if reply["action"] is not None:
                fail(g, "an action came for the episode's last step")
            elif tick_time(g, g["k"]) < g["end"]:
                g["sock"].sendall(encode_frame({"type": "new_episode", "opponent": "bench"}))
            else:
                sel.unregister(g["sock"])  # this game's time is up
            return
        g["obs"], g["reward"] = g["rng"].uniform(-1, 1, OBS_DIM), float(-abs(reply["action"][0]))
        heapq.heappush(due, (tick_time(g, g["k"]), i))

    while sel.get_map():
        now = time.monotonic()
        while due and due[0][0] <= now:
            tick_at, i = heapq.heappop(due)
            send_step(games[i], tick_at)
        wait = min(1.0, max(0.0, due[0][0] - time.monotonic())) if due else 1.0
        for key, _ in sel.select(wait):
            g = games[key.data]
            try:
                data = g["sock"].recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                fail(g, "the server closed the connection")
                continue
            g["buf"].feed(data)
            while g["error"] is None and (body := g["buf"].next()) is not None:
                answered(key.data, decode_body(body))
    for g in games:
        g["sock"].close()
        out[g["name"]] = {"sent": g["sent"], "lateness_ms": g["lateness_ms"], "trip_ms": g["trip_ms"],
                          **({"error": g["error"]} if g["error"] else {})}


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
    threads = args.games_as != "processes"  # threads, or one thread for every game
    start = time.monotonic() + (2.0 + 0.1 * args.clients if threads else 3.0 + 0.3 * args.clients)
    offsets = (np.random.default_rng(args.seed).uniform(0, 1 / args.tps, args.clients)
               if args.phases == "random" else np.zeros(args.clients))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    clock = (args.tps, args.seconds, args.episode)
    if args.games_as == "loop":
        games = [threading.Thread(target=game_loop, args=([f"g{i:02d}" for i in range(args.clients)], port, *clock,
                                                          out, [start + float(o) for o in offsets]), name="games")]
    elif threads:
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
    p.add_argument("--games-as", choices=["threads", "processes", "loop"], default="threads",
                   help="all games threads of this process (default; they share its GIL), each game a process "
                        "of its own, as separate games are, or every game on one thread's selector loop (the "
                        "harness then adds one runnable thread, not one a game)")
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
