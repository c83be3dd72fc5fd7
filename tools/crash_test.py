#!/usr/bin/env python3
"""Crash test for checkpoint writes: SIGKILL a process that saves continuously, many times.

Each child holds the directory's writer lock (``sacbot.store.lock.WriterLock``) while it saves, as a bot
does.  After every kill the parent must get that lock at once (the OS released the dead child's),
and under it removes stale temp files (as a starting bot does); the newest checkpoint must then
load, verified, and be at least as new as the last save the child reported as complete.
Last line is JSON; exit 1 if any kill left no loadable file or a held lock.

    python tools/crash_test.py --kills 500
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np


def child(directory: str, mb: float) -> None:
    """Save forever with increasing steps; print each step once its save is complete."""
    from sacbot.store.checkpoint import step_files, write_checkpoint
    from sacbot.store.lock import WriterLock

    WriterLock(directory).acquire()  # held until the kill: the OS must release it
    rng = np.random.default_rng(0)
    n = max(1, int(mb * (1 << 20) / 4 / 4))
    base = {f"actor.w{i}": rng.standard_normal(n).astype(np.float32) for i in range(4)}
    step = max([s for s, _ in step_files(directory)], default=0)  # steps rise across children
    rng_state = json.dumps(np.random.default_rng(0).bit_generator.state)
    while True:
        step += 1
        base["actor.w0"][0] = step
        # A whole training state, as a bot's: a writer refuses one a resume could not use.
        meta = {"grad_steps": step, "env_steps": step, "episodes": 0, "utd_carry": 0.0, "rng_numpy": rng_state,
                "learner": {"updates": step, "quant_phase": "off", "obs_dim": 1, "act_dim": 1}}
        write_checkpoint(directory, {"arrays": base, "meta": meta}, keep_last=3)
        print(step, flush=True)


def run(kills: int, mb: float = 2.0, seed: int = 0, log=None) -> dict:
    from sacbot.store import checkpoint as ck
    from sacbot.store.lock import LockHeld, WriterLock

    rnd = random.Random(seed)
    directory = tempfile.mkdtemp(prefix="sacbot-crash-")
    failures, temps_removed, steps = [], 0, []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    for k in range(kills):
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", directory, "--mb", str(mb)],
                             stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        first = p.stdout.readline()  # one complete save: the process is in its save loop
        if not first:
            p.wait()
            raise RuntimeError(f"crash-test child exited early (code {p.returncode})")
        # The kill moment is random on purpose: anywhere in the following write(s).
        time.sleep(rnd.uniform(0.0, 0.08))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        last_done = int(([first] + out.split())[-1])
        left = [f for f in os.listdir(directory) if f.startswith(ck.TMP_PREFIX)]
        try:
            lock = WriterLock(directory).acquire()
        except LockHeld as e:
            failures.append({"kill": k, "error": f"lock not released by the kill: {e}", "temps_left": left})
            continue
        try:
            temps_removed += len(ck.remove_stale_temps(directory))
            assert not any(f.startswith(ck.TMP_PREFIX) for f in os.listdir(directory))
            loaded = ck.load_latest(directory, set_aside_bad=False)
            if loaded is None:
                raise ck.CheckpointError("no checkpoint loads")
            c, path = loaded
            step = int(c["meta"]["grad_steps"])
            if step < last_done or float(c["arrays"]["actor.w0"][0]) != step:
                raise ck.CheckpointError(f"{path} holds step {step}, the child had completed {last_done}")
            steps.append(step)
        except ck.CheckpointError as e:
            failures.append({"kill": k, "error": str(e), "temps_left": left})
        finally:
            lock.close()  # the next child takes it
        if log:
            log(f"kill {k + 1}/{kills}: last complete save {last_done}, loaded {steps[-1] if steps else None}, "
                f"temp files left by the kill: {len(left)}")
    return {"bench": "crash_test", "kills": kills, "failures": failures, "temps_removed": temps_removed,
            "mb_per_save": mb, "max_step_reached": max(steps) if steps else 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=500)
    p.add_argument("--mb", type=float, default=2.0, help="payload size per save")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, a.mb)
        return
    res = run(a.kills, a.mb, a.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(res))
    sys.exit(1 if res["failures"] else 0)


if __name__ == "__main__":
    main()
