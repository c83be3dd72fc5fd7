#!/usr/bin/env python3
"""Checkpoint cost: save time and size per entry, and the learner's step time while saving.

Part 1 writes checkpoints of a learner at each hidden size, with and without a full
100k-transition replay, and reports bytes per entry and the median build and write times of a
full save (the first of a run) and of an incremental one (replay chunks already held).
Part 2 runs learner updates exactly as the training thread does (offer a snapshot to a
real I/O thread every ``--every`` steps) and compares step-time p50/p99 against the same
loop without saves, alternating blocks so machine noise hits both, and the saving blocks' median
step by where it falls: the step that builds and offers the payload, the step after it (which
the write overlaps), and the others.  Last line is JSON.

    python tools/bench/checkpoint.py --hidden 64 256 --every 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from benchlib import scratch_dir


def make_state(hidden: int, replay_n: int, obs_dim: int = 35, act_dim: int = 4):
    from sacbot.config import Config
    from sacbot.learning.training import TrainingState

    cfg = Config(hidden=hidden, buffer_size=max(replay_n, 1000), calib_updates=1)
    st = TrainingState.fresh(cfg, obs_dim, act_dim)
    rng = np.random.default_rng(0)
    n = max(replay_n, 64)
    obs = rng.standard_normal((n, obs_dim)).astype(np.float32)
    for i in range(n):
        st.replay.add(obs[i], rng.uniform(-1, 1, act_dim), 0.1, obs[(i + 1) % n], False, i % 1000 == 999)
    for _ in range(3):
        st.learner.update(st.replay.sample(16, 32, st.rng))
    return st


def save_costs(hidden: int, replay: bool, repeats: int) -> dict:
    from sacbot.store import checkpoint as ck
    st = make_state(hidden, 100_000 if replay else 0)
    d = scratch_dir("sacbot-ckbench-")
    out: dict = {"hidden": hidden, "replay": replay}
    # "full": a writer holding nothing (the first save of a run); "incremental": a writer that
    # holds the replay chunks of its previous save, 20 new transitions later (periodic saves).
    for kind in ("full", "incremental"):
        times, build = [], []
        for _ in range(repeats):
            cache = ck.ReplayChunkCache()
            if kind == "incremental":
                ck.write_checkpoint(d, st.payload(replay, since=cache.held()), keep_last=1, cache=cache)
                for _ in range(20):
                    st.replay.add(np.zeros(st.replay.obs_dim), np.zeros(st.replay.act_dim), 0.0,
                                  np.zeros(st.replay.obs_dim), False, False)
            t0 = time.perf_counter()
            payload = st.payload(replay, since=cache.held())
            build.append((time.perf_counter() - t0) * 1e3)
            r = ck.write_checkpoint(d, payload, keep_last=1, cache=cache)
            times.append(r.write_ms)
        out[kind] = {"payload_build_ms_median": round(statistics.median(build), 2),
                     "write_ms_median": round(statistics.median(times), 1)}
        if not replay:
            break  # without a replay the two are the same save
    out.update(file_bytes=r.bytes, entry_bytes=r.entry_bytes)
    return out


def step_times(hidden: int, every: int, blocks: int, block_steps: int, replay: bool) -> dict:
    from sacbot.learning.training import IOThread
    from sacbot.wire.channels import SaveSlot

    st = make_state(hidden, 100_000)
    d = scratch_dir("sacbot-ckbench-")
    slot = SaveSlot()
    io = IOThread(slot, d, 1, {}, {})
    io.start()
    res: dict[str, list[float]] = {"no_saves": [], "saving": []}
    phase: dict[str, list[float]] = {"offer": [], "after_offer": [], "others": []}  # saving blocks' steps
    obs, act = np.zeros(st.replay.obs_dim, np.float32), np.zeros(st.replay.act_dim, np.float32)
    offers = dropped = saves = 0
    held: dict = {}  # replay chunks the writer already holds, from its results (as LearnerLoop._collect_io)

    def collect() -> None:
        nonlocal held, saves
        for r in io.results():
            held = r.get("held", held) if "error" not in r else {}
            saves += "saved" in r

    for b in range(2 * blocks):
        mode = "saving" if b % 2 else "no_saves"
        for i in range(block_steps):
            t0 = time.perf_counter()
            # UTD 1: a transition arrives per gradient step, so saves have new replay rows to carry
            st.replay.add(obs, act, 0.1, obs, False, False)
            st.learner.update(st.replay.sample(16, 32, st.rng))
            if mode == "saving" and i % every == every - 1:  # what LearnerLoop._offer_save does
                offers += 1
                collect()
                if slot.has_room():
                    slot.offer(st.payload(with_replay=replay, since=held))  # as LearnerLoop._offer_save
                else:
                    dropped += 1
            ms = (time.perf_counter() - t0) * 1e3
            res[mode].append(ms)
            if mode == "saving":  # which steps pay: the one that builds the payload, the one the write overlaps
                k = "offer" if i % every == every - 1 else "after_offer" if i % every == 0 and i else "others"
                phase[k].append(ms)
    io.stop(60)
    collect()
    out = {}
    for k, v in res.items():
        a = np.array(v)
        out[k] = {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
                  "n": len(a)}
    out["p99_ratio"] = round(out["saving"]["p99_ms"] / out["no_saves"]["p99_ms"], 3)
    out["p50_ratio"] = round(out["saving"]["p50_ms"] / out["no_saves"]["p50_ms"], 3)
    out["saving_p50_ms_by_step"] = {k: round(float(np.median(v)), 2) for k, v in phase.items() if v}
    out.update(offers=offers, offers_dropped_busy=dropped, saves_written=saves, hidden=hidden,
               replay_in_saves=replay)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--block-steps", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(1)
    out: dict = {"bench": "checkpoint", "saves": [], "step_time_while_saving": []}
    for h in a.hidden:
        for replay in (False, True):
            r = save_costs(h, replay, a.repeats)
            out["saves"].append(r)
            print(json.dumps(r), flush=True)
    for replay in (False, True):
        r = step_times(a.hidden[0], a.every, a.blocks, a.block_steps, replay)
        out["step_time_while_saving"].append(r)
        print(json.dumps(r), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
