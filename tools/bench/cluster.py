#!/usr/bin/env python3
"""Scale-out on Ray, side by side in one run.  Four parts, each selectable:

* ``overhead``: env steps/s of one bot on Ray (``sacbot cluster --bots 1``) against a standalone
  bot (``sacbot run``, thread learner and process learner), same env, settings and seed, free
  pace, alternated within every round.  Held equal: the learner does no gradient steps in any arm
  (``--utd-ratio 0``, by default), so it is never the bottleneck; it still
  drains, stores every transition and publishes an actor per pass, as it does when training.
  Steps/s is read from the bot's own heartbeat (``status.json``: ``ticks`` and ``time``, written
  once a second) over ``--seconds`` after ``--warmup`` seconds of play.
* ``scaling``: ``sacbot cluster --bots N`` for N in ``--bots``; total env steps/s over the same
  window, against N x the one-bot cluster of the same round.
* ``ingest``: the Ray learner actor (``sacbot.app.ray_cluster.learner_actor``) fed msgpack batches
  (``messages.encode_batch``, TankDuel's sizes: obs 35, act 4) from this process as fast as it
  takes them (``--in-flight`` calls outstanding).  For each ``--ingest-utd``: transitions/s
  decoded (``transitions_received`` + ``dropped_at_learner``), accepted into the inbox
  (``transitions_received``) and stored in the replay (``env_steps_received``), the learner's
  gradient steps/s (read live through a subclass of ``LearnerServer`` with one read-only method:
  status moves only at the end of a pass), and the CPU time of the learner process per thread.
  At UTD >= 0.1 a chunk owing more steps than all windows last keeps one pass training
  throughout, and for each offered rate (``--ingest-rates``, 0: as fast as it takes them) a
  window of training alone (nothing sent) is followed by one of training while ingesting: the
  ratio of gradient steps/s says what ingest costs training.  UTD 0: the ingest ceiling with the
  training thread only storing.  Also a profile in this process: encode, decode, Channel.send,
  replay add, and the calls/s of a bare Ray actor method at the same in-flight bound.
* ``capacity``: ``tools/bench/learner.py --batch B`` for each ``--capacity-batches`` (the naive
  yardstick, ``--naive PATH``, beside it), samples/s = B x seq_len x steps/s, and the scale model
  N = C / (R x 30) at replay ratios 512, 128 and 32.

A local Ray instance listens on loopback only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before
``import ray``, as ``sacbot cluster`` does) and is shut down in a ``finally``; Ray processes that
a run leaves behind are killed by PID (only the ones that were not there before it).

    python tools/bench/cluster.py                          # all parts, ~15 min on 2 cores
    python tools/bench/cluster.py --parts overhead scaling --rounds 3 --seconds 15
    python tools/bench/cluster.py --parts ingest --ingest-utd 0 1
    python tools/bench/cluster.py --parts capacity --capacity-batches 16 64 256

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from sacbot.store.liveness import read_status

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, before any import of ray
TICK_HZ = 30.0
REPLAY_RATIOS = (512, 128, 32)


def say(*a) -> None:
    print("bench_cluster:", *a, file=sys.stderr, flush=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


# --- Ray processes: what a run leaves behind is killed by PID ------------------------------------
RAY_MARKS = ("ray::", "raylet", "gcs_server", "ray/dashboard", "ray/_private", "plasma_store")


def ray_pids() -> set[int]:
    """PIDs of Ray processes (whoever started them)."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in RAY_MARKS):
            out.add(int(d))
    return out


def session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def kill_new_ray(before: set[int], sid: int, grace: float = 10.0) -> list[int]:
    """Wait up to ``grace`` s for the Ray processes started since ``before`` in session ``sid``
    (ours: another user's Ray on the machine is never touched) to end; kill the rest by PID."""
    deadline = time.monotonic() + grace

    def mine() -> set[int]:
        return {p for p in ray_pids() - before if session_of(p) == sid}

    left = mine()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = mine()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        say(f"killed {len(left)} Ray processes left behind: {sorted(left)}")
    return sorted(left)


# --- parts 1 and 2: bots as subprocesses, steps/s from their heartbeats ---------------------------
def common_flags(a, d: str) -> list[str]:
    return ["--env", a.env, "--pace", "free", "--seed", str(a.seed), "--quiet", "--no-save-replay",
            "--learning-starts", str(a.learning_starts), "--utd-ratio", str(a.utd_ratio),
            "--weights-path", os.path.join(d, "w")]


def measure_bots(cmd: list[str], status_paths: list[str], a, log_path: str) -> dict:
    """Start ``cmd``; once every heartbeat shows ticks, wait ``--warmup`` s, then steps/s of each
    over ``--seconds``; SIGTERM (the final save), wait, and say what was left."""
    before = ray_pids()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict = {}
    try:
        deadline = time.monotonic() + a.start_timeout
        while True:
            sts = [read_status(s) for s in status_paths]
            if all(s and s.get("ticks") for s in sts):
                break
            if p.poll() is not None or time.monotonic() > deadline:
                tail = open(log_path).read()[-2000:]
                raise RuntimeError(f"{' '.join(cmd[2:5])}: no heartbeat with ticks (exit {p.poll()}): {tail}")
            time.sleep(0.2)
        time.sleep(a.warmup)
        s0 = [read_status(s) for s in status_paths]
        time.sleep(a.seconds)
        s1 = [read_status(s) for s in status_paths]
        rates = []
        for x, y in zip(s0, s1, strict=True):
            dt = y["time"] - x["time"]
            rates.append((y["ticks"] - x["ticks"]) / dt if dt > 0 else None)
        out = {"steps_per_s": [round(r, 1) for r in rates], "total_steps_per_s": round(sum(rates), 1),
               "drops": [y.get("drops", {}).get("transition") for y in s1],
               "policy_version": [y.get("policy_version") for y in s1]}
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        out["exit"] = p.returncode
        out["ray_left"] = kill_new_ray(before, p.pid)
    with open(log_path) as fh:
        lines = [ln for ln in fh.read().splitlines() if ln.startswith("{")]
    if lines:
        out["final"] = json.loads(lines[-1])
    return out


def standalone(a, kind: str, d: str) -> dict:
    cmd = [sys.executable, "-m", "sacbot", "run", *common_flags(a, d), "--learner", kind,
           "--run-dir", os.path.join(d, "run")]
    return measure_bots(cmd, [os.path.join(d, "run", "status.json")], a, os.path.join(d, "log.txt"))


def cluster(a, n: int, d: str) -> dict:
    cmd = [sys.executable, "-m", "sacbot", "cluster", "--bots", str(n), "--root", d, *common_flags(a, d)]
    paths = [os.path.join(d, f"bot{i}", "run", "status.json") for i in range(n)]
    return measure_bots(cmd, paths, a, os.path.join(d, "log.txt"))


def busy_others() -> str:
    """The top CPU users that are not this bench (for the write-up: a shared machine)."""
    out = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
    rows = []
    for ln in out.splitlines()[1:6]:
        pid, cpu, cmd = ln.split(None, 2)
        if float(cpu) >= 20 and int(pid) != os.getpid():
            rows.append(f"{cpu}% {cmd[:90]}")
    return "; ".join(rows)


def part_bots(a, parts: set[str], tmp: str) -> dict:
    arms: list[tuple[str, object]] = []
    if "overhead" in parts:
        arms += [(f"standalone-{k}", k) for k in a.standalone]
    counts = sorted(set(([1] if "overhead" in parts else []) + (a.bots if "scaling" in parts else [])))
    arms += [(f"cluster-{n}", n) for n in counts]
    res: dict[str, list[dict]] = {name: [] for name, _ in arms}
    others = []
    for r in range(a.rounds):
        order = arms if r % 2 == 0 else arms[::-1]  # alternate, so a drift hits every arm alike
        for name, arg in order:
            others.append(busy_others())
            d = os.path.join(tmp, f"r{r}-{name}")
            os.makedirs(d)
            got = standalone(a, arg, d) if name.startswith("standalone") else cluster(a, arg, d)
            res[name].append(got)
            say(f"round {r + 1}/{a.rounds} {name}: {got['steps_per_s']} steps/s (exit {got['exit']})")
    out: dict = {"env": a.env, "rounds": a.rounds, "warmup_s": a.warmup, "seconds": a.seconds,
                 "learning_starts": a.learning_starts, "utd_ratio": a.utd_ratio, "cores": os.cpu_count(),
                 "arms": {}, "busy_others": [o for o in others if o]}
    for name, runs in res.items():
        out["arms"][name] = {"total_steps_per_s": [x["total_steps_per_s"] for x in runs],
                             "per_bot": [x["steps_per_s"] for x in runs],
                             "median_total": med([x["total_steps_per_s"] for x in runs]),
                             "exits": [x["exit"] for x in runs], "ray_left": [x["ray_left"] for x in runs],
                             "drops": [x["drops"] for x in runs]}
    one = [x["total_steps_per_s"] for x in res.get("cluster-1", [])]
    if "overhead" in parts:
        for k in a.standalone:
            ref = [x["total_steps_per_s"] for x in res[f"standalone-{k}"]]
            out[f"overhead_ratio_vs_{k}"] = {
                "per_round": [round(c / s, 3) for c, s in zip(one, ref, strict=True)],
                "median_of_round_ratios": med([c / s for c, s in zip(one, ref, strict=True)]),
                "ratio_of_medians": round(med(one) / med(ref), 3)}
    if "scaling" in parts:
        out["scaling"] = {}
        for n in a.bots:
            tot = [x["total_steps_per_s"] for x in res[f"cluster-{n}"]]
            out["scaling"][str(n)] = {
                "median_total": med(tot),
                "per_round_ratio_vs_n_x_one": [round(t / (n * o), 3) for t, o in zip(tot, one, strict=True)],
                "median_ratio_vs_n_x_one": med([t / (n * o) for t, o in zip(tot, one, strict=True)]),
                "median_speedup_vs_one": med([t / o for t, o in zip(tot, one, strict=True)])}
    return out


# --- part 3: the learner actor's ingest -------------------------------------------------------
OBS, ACT = 35, 4  # TankDuel's sizes


def proc_threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError):
            pass
    return out


def make_batches(n: int):
    """Pre-encoded batches of ``n`` transitions: an episode start, middles, an end (truncated)."""
    import numpy as np

    from sacbot.wire.messages import NewEpisode, Transition, encode_batch

    rng = np.random.default_rng(0)

    def tr(end: bool) -> Transition:
        return Transition(rng.standard_normal(OBS).astype(np.float32), rng.uniform(-1, 1, ACT).astype(np.float32),
                          float(rng.standard_normal()), rng.standard_normal(OBS).astype(np.float32), False, end)

    start = encode_batch([NewEpisode("")] + [tr(False) for _ in range(n)])
    mid = encode_batch([tr(False) for _ in range(n)])
    end = encode_batch([tr(False) for _ in range(n - 1)] + [tr(True)])
    return [start] + [mid] * 6 + [end]  # an episode of 8 batches


class Feeder:
    """Calls ``learner.send`` with pre-encoded batches, ``in_flight`` outstanding, from ``sources``
    bots (each bot's batches in its own episode order)."""

    def __init__(self, ray, learner, batches, sources: int, in_flight: int):
        self.ray, self.learner, self.batches = ray, learner, batches
        self.sources, self.in_flight = sources, in_flight
        self.calls = 0
        self.errors = 0

    def run(self, until: float | None = None, transitions: int | None = None, per_batch: int = 1,
            rate: float = 0.0) -> None:
        """Send until ``until`` or ``transitions``; ``rate`` > 0 offers that many transitions/s
        (calls on a clock), 0 as fast as the learner takes them."""
        ray, pending, sent = self.ray, [], 0
        next_t = time.monotonic()
        while True:
            if until is not None and time.monotonic() >= until:
                break
            if transitions is not None and sent >= transitions:
                break
            if rate > 0:
                next_t += per_batch / rate
                pause = next_t - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            while len(pending) >= self.in_flight:
                done, pending = ray.wait(pending, num_returns=1)
                self._settle(done)
            k = self.calls
            src, pos = k % self.sources, (k // self.sources) % len(self.batches)
            pending.append(self.learner.send.remote(src, self.batches[pos], {"policy_version": 0}))
            self.calls += 1
            sent += per_batch
        if pending:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=60)
            self._settle(done)

    def _settle(self, done) -> None:
        for ref in done:
            try:
                self.ray.get(ref)
            except Exception:  # noqa: BLE001 - counted; the figure says so
                self.errors += 1


def probe_actor(ray, spec, queue_size: int):
    """``learner_actor``'s actor with one read-only method more: the live gradient step and replay
    counts (status moves only at the end of a pass, and at UTD 1 a pass lasts the whole window)
    and the native thread id of the training thread, for its CPU time."""
    from sacbot.app.ray_cluster import LearnerServer, learner_actor

    class ProbedLearner(LearnerServer):
        def live(self) -> dict:
            s = self.loop.state
            return {"grad_steps": s.grad_steps if s else 0, "stored": s.env_steps if s else 0,
                    "training_tid": self._thread.native_id}

    return learner_actor(spec, queue_size, cls=ProbedLearner)


def wait_status(ray, learner, pred, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = ray.get(learner.status.remote(), timeout=30)
        if pred(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def ingest_one(ray, a, utd: float, tmp: str) -> dict:
    from sacbot.config import Config
    from sacbot.wire.boundary import LearnerSpec

    cfg = Config(env="sacbot/TankDuel-v0", utd_ratio=utd, learning_starts=a.ingest_learning_starts,
                 save_interval=10**9, save_replay=False, hidden=64, batch_size=16, seq_len=32)
    d = os.path.join(tmp, f"ingest-utd{utd}")
    os.makedirs(d)
    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=OBS, act_dim=ACT,
                       spaces={"obs_dim": OBS, "act_dim": ACT, "obs_shape": [OBS], "action_low": [-1.0] * ACT,
                               "action_high": [1.0] * ACT},
                       metrics_path=os.path.join(d, "metrics.jsonl"), weights_dir=os.path.join(d, "w"))
    learner = probe_actor(ray, spec, a.ingest_queue)
    try:
        pid = ray.get(learner.pid.remote(), timeout=300)
        b = a.ingest_batch
        feeder = Feeder(ray, learner, make_batches(b), a.ingest_sources, a.in_flight)
        prefill = a.ingest_learning_starts + 4 * b
        feeder.run(transitions=prefill, per_batch=b)
        # Prefilled: the learner has stored it and (UTD > 0) made its first gradient steps.
        st = wait_status(ray, learner, lambda s: s.get("env_steps_received", 0) >= prefill
                         and (utd == 0 or s.get("learner_steps", 0) > 0), 120)
        say(f"ingest utd {utd}: prefilled {st.get('env_steps_received')} transitions, "
            f"{st.get('learner_steps')} gradient steps")

        def snap():
            return (ray.get(learner.status.remote()), ray.get(learner.live.remote()), proc_threads_cpu(pid),
                    feeder.calls, time.monotonic())

        def window(x, y) -> dict:
            (s0, l0, c0, k0, t0), (s1, l1, c1, k1, t1) = x, y
            dt = t1 - t0

            def rate(key):
                return round((s1.get(key, 0) - s0.get(key, 0)) / dt, 1)

            tid = l1["training_tid"]
            cpu = {t: (c1.get(t, 0) - c0.get(t, 0)) / dt for t in c1}
            w = {"seconds": round(dt, 2), "calls_per_s": round((k1 - k0) / dt, 1),
                 "received_per_s": rate("transitions_received"), "dropped_at_learner_per_s": rate("dropped_at_learner"),
                 "stored_per_s": round((l1["stored"] - l0["stored"]) / dt, 1),
                 "grad_steps_per_s": round((l1["grad_steps"] - l0["grad_steps"]) / dt, 2),
                 "learner_cpu_cores": round(sum(cpu.values()), 2),
                 "training_thread_cpu_cores": round(cpu.get(tid, 0.0), 2),
                 "other_threads_cpu_cores": sorted((round(v, 2) for t, v in cpu.items() if t != tid and v >= 0.01),
                                                   reverse=True),
                 "inbox_end": s1.get("inbox")}
            w["decoded_per_s"] = round(w["received_per_s"] + w["dropped_at_learner_per_s"], 1)
            return w

        out: dict = {"utd_ratio": utd, "batch": b, "in_flight": a.in_flight, "sources": a.ingest_sources,
                     "windows": []}
        rates = a.ingest_rates if utd >= 0.1 else [0.0]
        if utd >= 0.1:
            # A chunk that owes more gradient steps than all the windows last, all stored before the
            # first window: then one pass trains throughout, and the windows alternate training
            # alone (nothing sent) and training while ingesting, side by side in the same pass.
            span = len(rates) * (2 * a.ingest_warmup + a.baseline_seconds + a.seconds)
            chunk = int(60 * span / utd)
            feeder.run(transitions=chunk, per_batch=b)
            wait_status(ray, learner, lambda s: s.get("env_steps_received", 0) >= prefill + chunk, 120)
        for rate in rates:
            w: dict = {"offered_per_s": rate or "max"}
            if utd >= 0.1:
                time.sleep(a.ingest_warmup)
                x = snap()
                time.sleep(a.baseline_seconds)
                w["alone"] = window(x, snap())
            t_end = time.monotonic() + a.ingest_warmup + a.seconds
            th = threading.Thread(target=feeder.run, kwargs={"until": t_end, "per_batch": b, "rate": rate},
                                  daemon=True)
            th.start()
            time.sleep(a.ingest_warmup)
            x = snap()
            time.sleep(a.seconds)
            w["ingesting"] = window(x, snap())
            th.join(120)
            if w.get("alone", {}).get("grad_steps_per_s"):
                w["grad_steps_ratio_vs_alone"] = round(w["ingesting"]["grad_steps_per_s"]
                                                       / w["alone"]["grad_steps_per_s"], 3)
            say(f"ingest utd {utd}: {w}")
            out["windows"].append(w)
        out["errors"] = feeder.errors
        return out
    finally:
        ray.kill(learner, no_restart=True)


def profile_ingest(a) -> dict:
    """Per-transition costs of what the learner actor's ``send`` and the training thread's drain do,
    in this process, without Ray: decode, Channel.send, replay add (handle_message's work)."""
    import numpy as np

    from sacbot.learning.replay import SequenceReplay
    from sacbot.wire.channels import Channel
    from sacbot.wire.messages import Transition, Transitions, decode_batch, encode_batch

    b = a.ingest_batch
    data = make_batches(b)[1]
    msgs = decode_batch(data)
    sent = [t for m in msgs for t in (m.rows() if isinstance(m, Transitions) else [m])]  # as a bot queues them

    def per_tr(fn, reps: int) -> float:
        best = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            best.append((time.perf_counter() - t) / (reps * b) * 1e6)
        return round(statistics.median(best), 2)

    ch = Channel(10**7)

    def chan():
        for m in msgs:
            ch.send((0, m))
        ch.drain()

    rep = SequenceReplay(100_000, OBS, ACT)

    def add():  # what handle_message does with each decoded message
        for m in msgs:
            if isinstance(m, Transitions):
                rep.add_batch(m.obs, m.action, m.reward, m.next_obs, m.terminated, m.truncated, 0)
            elif isinstance(m, Transition):
                rep.add(m.obs, m.action, m.reward, m.next_obs, m.terminated, m.truncated, 0)

    return {"batch": b, "us_per_transition": {"encode_batch": per_tr(lambda: encode_batch(sent), 20),
                                              "decode_batch": per_tr(lambda: decode_batch(data), 20),
                                              "channel_send_and_drain": per_tr(chan, 20),
                                              "replay_add": per_tr(add, 20)},
            "bytes_per_transition": round(len(data) / b, 1), "numpy": np.__version__}


def ray_call_cost(ray, a) -> dict:
    """Calls/s of a bare Ray actor method (no payload work) at the same in-flight bound, and of
    the learner's ``send`` signature with an empty batch: the per-call floor."""

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Echo:
        def send(self, source, data, info=None):
            return 0

    e = Echo.remote()
    try:
        ray.get(e.send.remote(0, b"", None))
        f = Feeder(ray, e, [b"\x90"], 1, a.in_flight)
        f.run(until=time.monotonic() + 1.0)
        k0, t0 = f.calls, time.monotonic()
        f.run(until=t0 + min(5.0, a.seconds))
        return {"calls_per_s": round((f.calls - k0) / (time.monotonic() - t0), 1), "in_flight": a.in_flight}
    finally:
        ray.kill(e)


def part_ingest(a, tmp: str) -> dict:
    import ray

    from sacbot.app.ray_client import NAMESPACE

    before = ray_pids()
    out: dict = {"profile": profile_ingest(a), "runs": []}
    say("ingest profile (us per transition):", out["profile"]["us_per_transition"])
    try:
        ray.init(num_cpus=max(2, os.cpu_count() or 2), namespace=NAMESPACE, include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False)
        out["bare_ray_call"] = ray_call_cost(ray, a)
        say("bare Ray calls:", out["bare_ray_call"])
        for utd in a.ingest_utd:
            got = ingest_one(ray, a, utd, tmp)
            out["runs"].append(got)
    finally:
        ray.shutdown()
        out["ray_left"] = kill_new_ray(before, os.getsid(0))
    return out


# --- part 4: learner capacity and the scale model ---------------------------------------------
def part_capacity(a) -> dict:
    out: dict = {"seq_len": 32, "hidden": 64, "rounds": a.capacity_rounds, "seconds": a.capacity_seconds,
                 "batches": {}}
    for b in a.capacity_batches:
        cmd = [sys.executable, os.path.join(HERE, "learner.py"), "--batch", str(b), "--seq-len", "32",
               "--hidden", "64", "--rounds", str(a.capacity_rounds), "--seconds", str(a.capacity_seconds),
               "--naive", a.naive]
        say(f"capacity: {' '.join(cmd[1:])}")
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"bench_learner --batch {b} failed: {p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        s = b * 32
        on, off, naive = (r["median_steps_per_s"][k] for k in ("on", "off", "naive"))
        row = {"steps_per_s": {"quant_on": r["runs"]["on"], "quant_off": r["runs"]["off"], "naive": r["runs"]["naive"]},
               "median_steps_per_s": {"quant_on": on, "quant_off": off, "naive": naive},
               "samples_per_s": {"quant_on": round(on * s), "quant_off": round(off * s), "naive": round(naive * s)},
               "ratio_on_vs_naive": r["median_round_ratio_on"]}
        row["bots_at_30_tps"] = {str(rr): round(on * s / (rr * TICK_HZ), 2) for rr in REPLAY_RATIOS}
        out["batches"][str(b)] = row
        say(f"capacity batch {b}: {row['samples_per_s']} samples/s; bots at 30 tps {row['bots_at_30_tps']}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["overhead", "scaling", "ingest", "capacity"],
                   choices=["overhead", "scaling", "ingest", "capacity"])
    g = p.add_argument_group("overhead and scaling")
    g.add_argument("--env", default="Pendulum-v1", help="env of the bots (default Pendulum-v1)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--rounds", type=int, default=3, help="rounds; arms alternate order each round")
    g.add_argument("--warmup", type=float, default=5.0, help="seconds of play before the window")
    g.add_argument("--seconds", type=float, default=10.0, help="measurement window, s (also for ingest)")
    g.add_argument("--bots", type=int, nargs="+", default=[1, 2, 4], help="bot counts for scaling")
    g.add_argument("--standalone", nargs="+", default=["thread", "process"], choices=["thread", "process"],
                   help="standalone references for the overhead: `sacbot run --learner KIND`")
    g.add_argument("--learning-starts", type=int, default=1000)
    g.add_argument("--utd-ratio", type=float, default=0.0,
                   help="default 0: no arm's learner trains (not the bottleneck); sacbot refuses a "
                        "--learning-starts beyond the buffer, which earlier runs of this tool used instead")
    g.add_argument("--start-timeout", type=float, default=180.0)
    g = p.add_argument_group("ingest")
    g.add_argument("--ingest-rates", type=float, nargs="+", default=[2500, 5000, 10000, 20000, 0],
                   help="transitions/s offered to the training learner (UTD >= 0.1), one window each; 0: max")
    g.add_argument("--ingest-utd", type=float, nargs="+", default=[0.0, 1.0],
                   help="UTD ratios of the learner actor while it ingests (1: training throughout)")
    g.add_argument("--ingest-batch", type=int, default=64, help="transitions per send call")
    g.add_argument("--in-flight", type=int, default=8, help="send calls outstanding from the feeder")
    g.add_argument("--ingest-sources", type=int, default=4, help="bot sources the batches cycle over")
    g.add_argument("--ingest-queue", type=int, default=1_000_000, help="the learner actor's inbox capacity")
    g.add_argument("--ingest-learning-starts", type=int, default=1000)
    g.add_argument("--ingest-warmup", type=float, default=3.0)
    g.add_argument("--baseline-seconds", type=float, default=5.0,
                   help="window of training alone (nothing sent) before each ingest window, at UTD >= 0.1")
    g = p.add_argument_group("capacity")
    g.add_argument("--capacity-batches", type=int, nargs="+", default=[16, 64, 256])
    g.add_argument("--capacity-rounds", type=int, default=3)
    g.add_argument("--capacity-seconds", type=float, default=5.0)
    g.add_argument("--naive", metavar="PATH",
                   help="the yardstick script tools/bench/learner.py runs beside sacbot's learner (needed by capacity)")
    a = p.parse_args()
    parts = set(a.parts)
    if "capacity" in parts and not (a.naive and os.path.isfile(a.naive)):
        p.error(f"--parts capacity runs tools/bench/learner.py, which needs the yardstick: --naive PATH "
                f"(got {a.naive!r}); or leave capacity out of --parts")
    sys.path.insert(0, ROOT)
    tmp = tempfile.mkdtemp(prefix="bench_cluster-")
    out: dict = {"bench": "cluster", "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
                 "parts": sorted(parts)}
    try:
        if parts & {"overhead", "scaling"}:
            out["bots"] = part_bots(a, parts, tmp)
        if "ingest" in parts:
            out["ingest"] = part_ingest(a, tmp)
        if "capacity" in parts:
            out["capacity"] = part_capacity(a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
