#!/usr/bin/env python3
"""The learner boundary, side by side in one run: thread learner against process learner.

Four parts, each arm in a fresh interpreter, arms alternated within every repeat (thread first in
even repeats, process first in odd ones), medians over repeats and ratios of the same repeat:

* ``act``: act() latency with the learner saturated.  A real gymnasium env in free pace, UTD 8,
  the default hidden 64; the acting loop times ``agent.act(obs)`` itself with ``perf_counter_ns``
  around each call, from ``--warmup`` ticks after the first gradient step.  p50/p99/p99.9/max in
  µs, the same split by ticks that pulled a new actor and ticks that did not, and the learner's
  gradient steps/s over the same window (acting and learning competing, as in a real bot).
* ``steps``: learner gradient steps/s, both learners fed the same env transitions in lockstep
  (a chunk, then ``wait_processed``), after quantizer calibration.  End to end (wall clock, the
  transport included) and the learner's own per-pass figure (status ``grad_steps_per_s``).
* ``startup``: eval start-up (process start to the first action) and peak RSS (``VmHWM`` of the
  child, read by the parent while the child waits), today's torch-free acting side against
  ``--old`` (a worktree of the code before the boundary, run through ``PYTHONPATH``); also
  ``import sacbot.acting.agent`` alone (time, VmHWM, whether torch is in ``sys.modules``) and
  ``python -m sacbot eval --episodes 1`` end to end.
* ``transport``: a transition's encode, send and decode through a ``multiprocessing`` pipe
  (batch of 1 and of 64, per transition), against the thread learner's in-process queue; a
  snapshot's pack, send, unpack, ``WeightSnapshot.publish`` and ``SnapshotReader.pull`` (the
  shipped int8 bot's actor export), against publish + pull alone.

The last line of output is one JSON object.  Progress goes to stderr.

    git worktree add /tmp/sacbot-old 7cba3ad        # the code before the boundary, for ``startup``
    python tools/bench/boundary.py --old /tmp/sacbot-old            # a few minutes on 2 cores
    python tools/bench/boundary.py --quick --old /tmp/sacbot-old    # smoke test
    python tools/bench/boundary.py --parts act steps --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from benchlib import cpu_load

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PARTS = ("act", "steps", "startup", "transport")


def pct(xs_ns) -> dict:
    a = np.asarray(xs_ns, dtype=np.float64) / 1e3
    if not len(a):
        return {"n": 0}
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "p999_us": round(float(np.percentile(a, 99.9)), 1), "max_us": round(float(a.max()), 1), "n": len(a)}


def log(msg: str) -> None:
    print(f"bench_boundary: {msg}", file=sys.stderr, flush=True)


# --- arms (each runs in its own interpreter: ``bench_boundary.py _arm NAME JSON``) ---------------
def _nice(nice: int | None) -> dict:
    return {} if nice is None else {"learner_nice": nice}


def _bench_config(tmp: str, **kw):
    from sacbot.config import Config

    return Config(quiet=True, run_dir=os.path.join(tmp, "run"), weights_path=os.path.join(tmp, "w"),
                  save_interval=10**9, keep_last=0, save_replay=False, **kw)


def arm_act(learner: str, env: str, ticks: int, warmup: int, utd: float, hidden: int, learning_starts: int,
            seed: int, limit_s: float, nice: int | None = None) -> dict:
    from sacbot import Agent
    from sacbot.acting.games import make_env, with_env_critic_obs

    tmp = tempfile.mkdtemp(prefix="sacbot-bench-act-")
    e = make_env(env)
    cfg = with_env_critic_obs(_bench_config(tmp, env=env, learner=learner, utd_ratio=utd, hidden=hidden, seed=seed,
                                            learning_starts=learning_starts, pace="free", **_nice(nice)), e)
    t_start = time.perf_counter()
    agent = Agent(cfg, e.observation_space, e.action_space)  # returns once the learner is up
    start_s = time.perf_counter() - t_start
    lat = np.zeros(ticks, np.int64)
    cpu = np.zeros(ticks, np.int64)  # the acting thread's own CPU time in the call
    preempted = np.zeros(ticks, bool)  # an involuntary context switch of the acting thread around the call
    pulled = np.zeros(ticks, bool)
    rusage, thread = resource.getrusage, resource.RUSAGE_THREAD
    obs, _ = e.reset(seed=seed)
    agent.new_episode("bench")
    i = 0
    warm_left = None  # ticks still to go after the first gradient step
    steps0 = t_meas = 0.0
    deadline = time.monotonic() + limit_s
    perf, tcpu = time.perf_counter_ns, time.thread_time_ns
    while i < ticks:
        v = agent.policy_version
        r0 = rusage(thread).ru_nivcsw
        c0 = tcpu()
        t0 = perf()
        a = agent.act(obs)
        t1 = perf()
        c1 = tcpu()
        r1 = rusage(thread).ru_nivcsw
        if warm_left == 0:
            lat[i] = t1 - t0
            cpu[i] = c1 - c0
            preempted[i] = r1 > r0
            pulled[i] = agent.policy_version != v
            i += 1
        obs, r, term, trunc, info = e.step(a)
        agent.observe(r, obs, term, trunc, info)
        if term or trunc:
            obs, _ = e.reset()
            agent.new_episode("bench")
        if warm_left is None:
            if agent.learner.status().learner_steps > 0:
                warm_left = warmup
            elif time.monotonic() > deadline:
                raise SystemExit(f"learning did not start within {limit_s} s")
        elif warm_left > 0:
            warm_left -= 1
            if warm_left == 0:
                steps0, t_meas = agent.learner.status().learner_steps, time.perf_counter()
    wall = time.perf_counter() - t_meas
    st = agent.learner.status()
    steps = st.learner_steps - steps0
    drops = dict(agent.learner.drops())
    # A close waits for the pass in progress (2,048 steps at UTD 8, minutes on a busy machine); the
    # bench needs no final save, so end the learner at once.
    if learner == "process":
        agent.learner.proc.kill()
    else:
        agent.learner._stop.set()
    agent.close()
    shutil.rmtree(tmp, ignore_errors=True)
    slow = lat > 1_000_000  # over 1 ms: where the time went
    return {"learner": learner, "act": pct(lat), "act_pulled": pct(lat[pulled]), "act_no_pull": pct(lat[~pulled]),
            "act_not_preempted": pct(lat[~preempted]), "act_cpu": pct(cpu), "preempted_calls": int(preempted.sum()),
            "over_1ms": {"calls": int(slow.sum()), "preempted": int((slow & preempted).sum()),
                         "median_wall_us": round(float(np.median(lat[slow])) / 1e3, 1) if slow.any() else None,
                         "median_cpu_us": round(float(np.median(cpu[slow])) / 1e3, 1) if slow.any() else None},
            "ticks_per_s": round(ticks / wall, 1), "agent_start_s": round(start_s, 3),
            # a pass at UTD 8 drains a full queue (256 transitions: 2,048 steps, tens of seconds), so
            # this counts only passes that ended inside the window; part "steps" measures the rate
            "grad_steps_reported_in_window": int(steps), "drops": drops, "torch_in_bot": "torch" in sys.modules}


def _transitions(env: str, n: int, seed: int) -> list:
    """``n`` env transitions under uniform random actions (as the Agent sends them: actions in
    [-1, 1]), with a NewEpisode at each start: the same stream for both learners."""
    from sacbot.acting.games import make_env
    from sacbot.wire.messages import NewEpisode, Transition

    e = make_env(env)
    rng = np.random.default_rng(seed)
    low, high = e.action_space.low, e.action_space.high
    obs, _ = e.reset(seed=seed)
    out: list = [NewEpisode("bench")]
    while sum(isinstance(m, Transition) for m in out) < n:
        a = rng.uniform(-1, 1, e.action_space.shape).astype(np.float32)
        nobs, r, term, trunc, _ = e.step(low + (a + 1) * (high - low) / 2)
        out.append(Transition(np.asarray(obs, np.float32).reshape(-1), a, float(r),
                              np.asarray(nobs, np.float32).reshape(-1), bool(term), bool(trunc)))
        obs = nobs
        if term or trunc:
            obs, _ = e.reset()
            out.append(NewEpisode("bench"))
    return out


def arm_steps(learner: str, env: str, chunk: int, chunks: int, warm_chunks: int, prefill: int, utd: float,
              hidden: int, calib: int, seed: int, nice: int | None = None) -> dict:
    from sacbot import Agent
    from sacbot.acting.games import make_env, with_env_critic_obs
    from sacbot.wire.messages import Transition

    n_total = prefill + chunk * (warm_chunks + chunks)
    stream = _transitions(env, n_total, seed)
    tmp = tempfile.mkdtemp(prefix="sacbot-bench-steps-")
    e = make_env(env)
    cfg = with_env_critic_obs(_bench_config(tmp, env=env, learner=learner, utd_ratio=utd, hidden=hidden, seed=seed,
                                            learning_starts=prefill, calib_updates=calib, pace="free", **_nice(nice)),
                              e)
    agent = Agent(cfg, e.observation_space, e.action_space)
    link = agent.learner
    sent = 0
    pos = 0

    def feed(n: int) -> None:  # the next n transitions (and the episode starts among them), then wait
        nonlocal sent, pos
        msgs, k = [], 0
        while k < n:
            m = stream[pos]
            pos += 1
            msgs.append(m)
            k += isinstance(m, Transition)
        while pos < len(stream) and not isinstance(stream[pos], Transition):
            msgs.append(stream[pos])
            pos += 1
        assert link.send(msgs) == len(msgs), "the queue dropped a message"
        sent += n
        if not link.wait_processed(sent, timeout=600.0):
            raise SystemExit(f"the learner did not process {sent} transitions: {link.status().last_error}")

    for _ in range(0, prefill, 100):
        feed(min(100, prefill - sent))
    for _ in range(warm_chunks):
        feed(chunk)
    st = link.status()
    steps0, phase = st.learner_steps, st.quant_phase
    per_pass = []
    t0 = time.perf_counter()
    for _ in range(chunks):
        feed(chunk)
        per_pass.append(link.status().grad_steps_per_s)
    wall = time.perf_counter() - t0
    steps = link.status().learner_steps - steps0
    agent.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"learner": learner, "grad_steps": int(steps), "wall_s": round(wall, 3),
            "grad_steps_per_s": round(steps / wall, 2),
            "learner_grad_steps_per_s_median": round(float(np.median(per_pass)), 2),
            "quant_phase_at_start": phase}


def _child_echo(conn_in, conn_out) -> None:
    """Transport child: receive a batch, decode it, answer with (received_ns, decoded_ns)."""
    import struct

    from sacbot.wire.messages import decode_batch

    perf = time.perf_counter_ns
    while True:
        try:
            data = conn_in.recv_bytes()
        except EOFError:
            return
        t2 = perf()
        decode_batch(data)
        t3 = perf()
        conn_out.send_bytes(struct.pack("qq", t2, t3))


def _child_snapshots(arrays: dict, n: int, conn_out, conn_ack) -> None:
    """Transport child in the learner's role: pack and send ``n`` snapshots, one at a time."""
    import struct

    from sacbot.wire.messages import pack

    perf = time.perf_counter_ns
    for v in range(1, n + 1):
        t0 = perf()
        data = pack(["snap", v, arrays])
        t1 = perf()
        conn_out.send_bytes(struct.pack("qq", t0, t1) + data)
        conn_ack.recv_bytes()


def arm_transport(iters: int, snapshots: int, env: str) -> dict:
    import multiprocessing
    import struct
    import threading

    from sacbot.acting import policy
    from sacbot.store import checkpoint as ck
    from sacbot.store.pretrained import shipped_dir
    from sacbot.wire.channels import Channel
    from sacbot.wire.messages import unpack
    from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot

    stream = [m for m in _transitions(env, 64 * 4, 0) if type(m).__name__ == "Transition"]
    perf = time.perf_counter_ns
    ctx = multiprocessing.get_context("spawn")
    out: dict = {}
    # -- transitions through the pipe, as the process learner sends them -------------------------
    from sacbot.wire.messages import encode_batch

    to_r, to_w = ctx.Pipe(duplex=False)
    back_r, back_w = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_echo, args=(to_r, back_w), daemon=True)
    child.start()
    for bs in (1, 64):
        enc, send, dec, total, size = [], [], [], [], 0
        for i in range(iters + 20):
            batch = stream[(i * bs) % len(stream):][:bs] if bs == 1 else stream[:64]
            t0 = perf()
            data = encode_batch(batch)
            t1 = perf()
            to_w.send_bytes(data)
            t2, t3 = struct.unpack("qq", back_r.recv_bytes())
            if i >= 20:  # the first few warm the child's imports and caches
                enc.append(t1 - t0)
                send.append(t2 - t1)
                dec.append(t3 - t2)
                total.append(t3 - t0)
                size = len(data)
        out[f"pipe_batch{bs}"] = {"bytes_per_batch": size, "encode_us": _med_us(enc, bs), "send_us": _med_us(send, bs),
                                  "decode_us": _med_us(dec, bs), "total_us": _med_us(total, bs),
                                  "total_p99_us": round(float(np.percentile(total, 99)) / 1e3 / bs, 2),
                                  "per": "transition"}
    to_w.close()
    child.join(10)
    # -- the thread learner's path for the same batch: Channel.send on one thread, recv on another --
    ch = Channel(4096)
    got: list = []

    def consumer(n: int) -> None:
        for _ in range(n):
            ch.recv(timeout=5.0)
            got.append(perf())
    for bs in (1, 64):
        got.clear()
        t_sent = []
        th = threading.Thread(target=consumer, args=((iters + 20) * bs,))
        th.start()
        for i in range(iters + 20):
            t0 = perf()
            for m in (stream[:1] if bs == 1 else stream[:64]):
                ch.send(m)
            t_sent.append(t0)
            while len(got) < (i + 1) * bs:  # one batch at a time, as the pipe arm
                time.sleep(0)
        th.join()
        lat = [got[(i + 1) * bs - 1] - t_sent[i] for i in range(20, iters + 20)]
        out[f"queue_batch{bs}"] = {"total_us": _med_us(lat, bs), "per": "transition"}
    # -- snapshots: the shipped bot's int8 actor export --------------------------------------------
    path = next(str(p) for p in shipped_dir().iterdir() if p.name.endswith(".zip"))
    ckpt = ck.read_checkpoint(path, entries=("actor",))
    arrays = {k[len("export."):]: v for k, v in ckpt["arrays"].items() if k.startswith("export.")}
    snap_r, snap_w = ctx.Pipe(duplex=False)
    ack_r, ack_w = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_snapshots, args=(arrays, snapshots + 5, snap_w, ack_r), daemon=True)
    child.start()
    snap = WeightSnapshot()
    reader = SnapshotReader(snap)
    rows = []
    for i in range(snapshots + 5):
        raw = snap_r.recv_bytes()
        t2 = perf()
        t0, t1 = struct.unpack("qq", raw[:16])
        kind, version, arr = unpack(raw[16:])
        t3 = perf()
        snap.publish(arr)
        t4 = perf()
        reader.pull()
        t5 = perf()
        policy.build_params(reader.arrays)
        t6 = perf()
        ack_w.send_bytes(b"k")
        if i >= 5:
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t5 - t0, len(raw) - 16))
    child.join(10)
    r = np.asarray(rows, np.float64)
    med = [round(float(x) / 1e3, 1) for x in np.median(r[:, :7], axis=0)]
    out["snapshot_pipe"] = dict(zip(("pack_us", "send_us", "unpack_us", "publish_us", "pull_us",
                                     "build_params_us", "total_us"), med), bytes=int(r[0, 7]),
                                raw_array_bytes=int(sum(a.nbytes for a in arrays.values())), n=len(rows))
    thread_rows = []
    for _ in range(snapshots):
        t0 = perf()
        snap.publish(arrays)
        t1 = perf()
        reader.pull()
        t2 = perf()
        thread_rows.append((t1 - t0, t2 - t1, t2 - t0))
    med = [round(float(x) / 1e3, 1) for x in np.median(np.asarray(thread_rows, np.float64), axis=0)]
    out["snapshot_thread"] = dict(zip(("publish_us", "pull_us", "total_us"), med), n=snapshots)
    return out


def _med_us(xs, per: int) -> float:
    return round(float(np.median(xs)) / 1e3 / per, 2)


ARMS = {"act": arm_act, "steps": arm_steps, "transport": arm_transport}


def run_arm(name: str, kwargs: dict, timeout: float) -> dict:
    """One arm in a fresh interpreter (the parent imports neither torch nor the learner)."""
    cmd = [sys.executable, os.path.abspath(__file__), "_arm", name, json.dumps(kwargs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"arm {name} {kwargs} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


# --- eval start-up: plain subprocesses, one at a time ---------------------------------------------
FIRST_ACTION = r"""
import os, sys, time
from sacbot import Agent
from sacbot.config import Config
from sacbot.acting.games import make_env
env = make_env("sacbot/TankDuel-v0")
agent = Agent(Config(eval_mode=True, quiet=True, run_dir=os.path.join(os.getcwd(), "run")),
              env.observation_space, env.action_space)
agent.new_episode("x")
obs, _ = env.reset(seed=0)
agent.act(obs)
print("FIRST_ACTION", "torch" in sys.modules, __import__("sacbot").__file__, agent.loaded_from, flush=True)
sys.stdin.readline()
"""
IMPORT_AGENT = r"""
import sys
import sacbot.acting.agent
print("FIRST_ACTION", "torch" in sys.modules, __import__("sacbot").__file__, "-", flush=True)
sys.stdin.readline()
"""
EVAL_CLI = r"""
import runpy, sys
def hwm():
    for ln in open("/proc/self/status"):
        if ln.startswith("VmHWM"):
            print("VMHWM_KB", ln.split()[1], "torch" in sys.modules, __import__("sacbot").__file__, file=sys.stderr)
import atexit
atexit.register(hwm)
sys.argv = ["sacbot", "eval", "--episodes", "1", "--quiet"]
runpy.run_module("sacbot", run_name="__main__", alter_sys=True)
"""


def _proc_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith(field + ":"):
                return int(ln.split()[1])
    return -1


def measure_paused(script: str, env: dict, cwd: str) -> dict:
    """Wall clock from Popen to the child's marker line; VmHWM read from /proc while it waits."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    line = p.stdout.readline()
    dt = time.perf_counter() - t0
    hwm = _proc_kb(p.pid, "VmHWM") if line.startswith("FIRST_ACTION") else -1
    p.stdin.write("\n")
    p.stdin.flush()
    _, err = p.communicate(timeout=60)
    if not line.startswith("FIRST_ACTION"):
        raise RuntimeError(f"start-up probe failed:\n{err[-3000:]}")
    _, torch_loaded, sacbot_file, loaded_from = line.split()
    return {"s": round(dt, 3), "vmhwm_mb": round(hwm / 1024, 1), "torch_loaded": torch_loaded == "True",
            "sacbot_file": sacbot_file, "loaded_from": loaded_from}


def measure_eval_cli(env: dict, cwd: str) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", EVAL_CLI], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=600)
    dt = time.perf_counter() - t0
    hw = [ln.split() for ln in p.stderr.splitlines() if ln.startswith("VMHWM_KB")]
    if p.returncode != 0 or not hw:
        raise RuntimeError(f"sacbot eval failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return {"s": round(dt, 3), "vmhwm_mb": round(int(hw[-1][1]) / 1024, 1), "torch_loaded": hw[-1][2] == "True",
            "sacbot_file": hw[-1][3]}


def part_startup(old: str | None, repeats: int, eval_cli: bool) -> dict:
    """Today's code against ``old`` (PYTHONPATH), alternated; each in a fresh directory holding
    the shipped bot as weights/pretrained/, so both find the same bot the same way."""
    bot = os.path.join(ROOT, "sacbot", "bots", "tankduel.zip")
    sides = {"new": None} if not old else {"new": None, "old": old}
    res: dict = {k: {"first_action": [], "import_agent": [], "eval_cli": []} for k in sides}
    for r in range(repeats):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            if sides[side]:
                env["PYTHONPATH"] = sides[side]
            cwd = tempfile.mkdtemp(prefix=f"sacbot-bench-start-{side}-")
            os.makedirs(os.path.join(cwd, "weights", "pretrained"))
            shutil.copy(bot, os.path.join(cwd, "weights", "pretrained", "tankduel.zip"))
            res[side]["first_action"].append(measure_paused(FIRST_ACTION, env, cwd))
            res[side]["import_agent"].append(measure_paused(IMPORT_AGENT, env, cwd))
            if eval_cli:
                res[side]["eval_cli"].append(measure_eval_cli(env, cwd))
            shutil.rmtree(cwd, ignore_errors=True)
        log(f"startup repeat {r + 1}/{repeats}: " + ", ".join(
            f"{s} first action {res[s]['first_action'][-1]['s']} s / {res[s]['first_action'][-1]['vmhwm_mb']} MB"
            for s in sides))
    out: dict = {}
    for side, d in res.items():
        out[side] = {}
        for what, rows in d.items():
            if rows:
                out[side][what] = {"median_s": round(float(np.median([x["s"] for x in rows])), 3),
                                   "median_vmhwm_mb": round(float(np.median([x["vmhwm_mb"] for x in rows])), 1),
                                   "runs_s": [x["s"] for x in rows], "runs_vmhwm_mb": [x["vmhwm_mb"] for x in rows],
                                   "torch_loaded": sorted({x["torch_loaded"] for x in rows}),
                                   "sacbot_file": rows[0]["sacbot_file"]}
                if "loaded_from" in rows[0]:
                    out[side][what]["loaded_from"] = rows[0]["loaded_from"]
    if "old" in out:
        out["ratio_new_over_old"] = {
            w: {"time": _ratio_med([a["s"] for a in res["new"][w]], [b["s"] for b in res["old"][w]]),
                "vmhwm": _ratio_med([a["vmhwm_mb"] for a in res["new"][w]], [b["vmhwm_mb"] for b in res["old"][w]])}
            for w in res["new"] if res["new"][w]}
    return out


def _ratio_med(num: list, den: list) -> float:
    return round(float(np.median([a / b for a, b in zip(num, den)])), 3)


# --- the side-by-side parts -----------------------------------------------------------------------
def variants(nice: list[int]) -> dict[str, dict]:
    """The arms of a side-by-side part: thread and process learner at the default ``learner_nice``,
    and each again at every value of ``--learner-nice``."""
    out: dict[str, dict] = {"thread": {"learner": "thread"}, "process": {"learner": "process"}}
    for n in nice:
        out[f"thread_nice{n}"] = {"learner": "thread", "nice": n}
        out[f"process_nice{n}"] = {"learner": "process", "nice": n}
    return out


def side_by_side(name: str, kwargs: dict, arms: dict[str, dict], repeats: int, timeout: float) -> list[dict]:
    rows = []
    for r in range(repeats):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        got = {k: run_arm(name, {**arms[k], **kwargs}, timeout) for k in order}
        rows.append(got)
        log(f"{name} repeat {r + 1}/{repeats}: " + json.dumps({k: _brief(name, v) for k, v in got.items()}))
    return rows


def _brief(name: str, v: dict) -> dict:
    if name == "act":
        return {**{k: v["act"][k] for k in ("p50_us", "p99_us", "p999_us", "max_us")},
                "preempted": v["preempted_calls"], "ticks/s": v["ticks_per_s"]}
    return {"steps/s": v["grad_steps_per_s"], "learner": v["learner_grad_steps_per_s_median"]}


def summarize_act(rows: list[dict]) -> dict:
    keys = ("p50_us", "p99_us", "p999_us", "max_us")
    out: dict = {}
    for k in rows[0]:
        out[k] = {f"median_{q}": round(float(np.median([r[k]["act"][q] for r in rows])), 1) for q in keys}
        out[k]["median_not_preempted"] = {q: round(float(np.median([r[k]["act_not_preempted"][q] for r in rows])), 1)
                                          for q in keys}
        out[k]["median_cpu"] = {q: round(float(np.median([r[k]["act_cpu"][q] for r in rows])), 1) for q in keys}
        out[k]["median_agent_start_s"] = round(float(np.median([r[k]["agent_start_s"] for r in rows])), 3)
        for part in ("act", "act_pulled", "act_no_pull", "act_not_preempted", "act_cpu", "preempted_calls",
                     "over_1ms", "ticks_per_s", "drops", "agent_start_s"):
            out[k][part] = [r[k][part] for r in rows]
        out[k]["torch_in_bot"] = sorted({r[k]["torch_in_bot"] for r in rows})
    for k in rows[0]:
        if k != "thread":
            out[f"ratio_{k}_over_thread"] = {q: _ratio_med([r[k]["act"][q] for r in rows],
                                                           [r["thread"]["act"][q] for r in rows]) for q in keys}
    p = out["process"]
    out["goal_process"] = {"p99_le_100us": p["median_p99_us"] <= 100, "p999_le_300us": p["median_p999_us"] <= 300}
    return out


def summarize_steps(rows: list[dict]) -> dict:
    out: dict = {}
    for k in rows[0]:
        out[k] = {"median_grad_steps_per_s": round(float(np.median([r[k]["grad_steps_per_s"] for r in rows])), 2),
                  "grad_steps_per_s": [r[k]["grad_steps_per_s"] for r in rows],
                  "median_learner_grad_steps_per_s": round(float(np.median(
                      [r[k]["learner_grad_steps_per_s_median"] for r in rows])), 2),
                  "learner_grad_steps_per_s": [r[k]["learner_grad_steps_per_s_median"] for r in rows],
                  "grad_steps": [r[k]["grad_steps"] for r in rows],
                  "quant_phase": sorted({str(r[k]["quant_phase_at_start"]) for r in rows})}
    for k in rows[0]:
        if k == "thread":
            continue
        per = [r[k]["grad_steps_per_s"] / r["thread"]["grad_steps_per_s"] for r in rows]
        out[f"ratio_{k}_over_thread"] = {
            "per_repeat": [round(x, 3) for x in per], "median_of_ratios": round(float(np.median(per)), 3),
            "ratio_of_medians": round(out[k]["median_grad_steps_per_s"] / out["thread"]["median_grad_steps_per_s"], 3),
            "learner_own": _ratio_med([r[k]["learner_grad_steps_per_s_median"] for r in rows],
                                      [r["thread"]["learner_grad_steps_per_s_median"] for r in rows])}
    out["goal_process_within_5pct"] = out["ratio_process_over_thread"]["median_of_ratios"] >= 0.95
    return out


def busy_processes() -> list[str]:
    """Other CPU-heavy processes (ps %CPU >= 30), so a reader knows what shared the cores."""
    try:
        p = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for ln in p.stdout.splitlines()[1:]:
        pid, cpu, args = ln.split(None, 2)
        if float(cpu) >= 30 and int(pid) != os.getpid():
            out.append(f"{pid} {cpu}% {args[:160]}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--quick", action="store_true", help="smoke-test sizes (one repeat, short arms); not for figures")
    p.add_argument("--repeats", type=int, default=None, help="repeats of each side-by-side part (default 3; quick 1)")
    p.add_argument("--env", default="sacbot/TankDuel-v0", help="gymnasium env of the act and steps parts")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--utd", type=float, default=8.0, help="update-to-data ratio (saturates the learner)")
    p.add_argument("--ticks", type=int, default=None, help="act: timed ticks per arm (default 20000; quick 2000)")
    p.add_argument("--warmup", type=int, default=None,
                   help="act: ticks after the first gradient step before timing starts (default 3000; quick 300)")
    p.add_argument("--learning-starts", type=int, default=None, help="act: default 1000; quick 300")
    p.add_argument("--chunk", type=int, default=None, help="steps: transitions per lockstep chunk (default 8; quick 4)")
    p.add_argument("--chunks", type=int, default=None, help="steps: timed chunks per arm (default 8; quick 2)")
    p.add_argument("--calib", type=int, default=None,
                   help="steps: quantizer calibration updates, all spent before timing (default 64; quick 8)")
    p.add_argument("--iters", type=int, default=None, help="transport: batches per size (default 2000; quick 200)")
    p.add_argument("--learner-nice", type=int, nargs="*", default=[],
                   help="act, steps: also run both learners at these learner_nice values (the default arms use "
                        "the config's default)")
    p.add_argument("--load", type=int, default=0,
                   help="act, steps: CPU-bound processes running beside the arms (the core count: every core busy)")
    p.add_argument("--old", default=None, help="startup: a worktree of the code before the boundary (e.g. 7cba3ad)")
    p.add_argument("--no-eval-cli", action="store_true", help="startup: skip `python -m sacbot eval --episodes 1`")
    a = p.parse_args()
    q = a.quick
    repeats = a.repeats or (1 if q else 3)
    ticks = a.ticks or (2000 if q else 20000)
    warmup = a.warmup if a.warmup is not None else (300 if q else 3000)
    ls = a.learning_starts or (300 if q else 1000)
    chunk = a.chunk or (4 if q else 8)
    chunks = a.chunks or (2 if q else 8)
    calib = a.calib if a.calib is not None else (8 if q else 64)
    iters = a.iters or (200 if q else 2000)
    arms = variants(a.learner_nice)
    utd_steps = chunk * a.utd
    warm_chunks = int(np.ceil((calib + 1) / utd_steps)) + 1  # calibration ends before the timed chunks

    result: dict = {"bench": "boundary", "date": time.strftime("%Y-%m-%d"), "quick": q, "repeats": repeats,
                    "env": a.env, "hidden": a.hidden, "utd": a.utd, "cpus": os.cpu_count(),
                    "busy_processes_at_start": busy_processes()}
    if result["busy_processes_at_start"]:
        log("other busy processes: " + "; ".join(result["busy_processes_at_start"]))
    if "transport" in a.parts:
        result["transport"] = run_arm("transport", {"iters": iters, "snapshots": max(50, iters // 10),
                                                    "env": a.env}, 600)
        log("transport: " + json.dumps(result["transport"]))
    if "startup" in a.parts:
        if not a.old:
            log("startup: no --old given; today's code only")
        result["startup"] = part_startup(a.old, 1 if q else max(repeats, 5), not a.no_eval_cli)
    result["load"] = a.load
    with cpu_load(a.load):
        if "steps" in a.parts:
            rows = side_by_side("steps", {"env": a.env, "chunk": chunk, "chunks": chunks, "warm_chunks": warm_chunks,
                                          "prefill": 300, "utd": a.utd, "hidden": a.hidden, "calib": calib,
                                          "seed": 0}, arms, repeats, 1800)
            result["steps"] = {"chunk": chunk, "chunks": chunks, "calib": calib, **summarize_steps(rows)}
        if "act" in a.parts:
            rows = side_by_side("act", {"env": a.env, "ticks": ticks, "warmup": warmup, "utd": a.utd,
                                        "hidden": a.hidden, "learning_starts": ls, "seed": 0, "limit_s": 600.0},
                                arms, repeats, 1800)
            result["act"] = {"ticks": ticks, "warmup": warmup, "learning_starts": ls, **summarize_act(rows)}
    result["busy_processes_at_end"] = busy_processes()
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_arm":
        sys.path.insert(0, ROOT)
        print(json.dumps(ARMS[sys.argv[2]](**json.loads(sys.argv[3]))))
    else:
        main()
