#!/usr/bin/env python3
"""The robustness suite: sacbot's defaults on tasks nobody tuned them for.

Tasks of different reward scales, horizons and sparsity (``--tasks``), each fully observed and
partially observed three ways (``--views``: P positions only, V velocities only, F flickering;
``sacbot.envs.pomdp``); arms (``--arms``): sacbot with its defaults (``--no-preset``: no env's preset,
the P and V Pendulums' included), its memoryless control, SB3
SAC with its defaults (the ``bench`` extra), and the random policy as the floor.  Each run trains
for ``--steps`` env steps and is scored by the mean return of ``--episodes`` deterministic eval
episodes on seeds apart from training's.

Resumable over several sittings: every finished run is appended to ``--out`` (JSONL; by default
``docs/results/robust.jsonl``, the repo's record, which BENCHMARKS.md reports) as it ends,
with the commit, the machine's processor, the date and its wall time, and a run already there (same
task, view, arm, seed and steps) is not run again.  ``--jobs N`` runs N at once (each run uses about
one core: lockstep pace, one torch thread).  The report reads
the whole file: per task and view, each arm's interquartile mean over seeds with a bootstrap 95%
confidence interval (rliable's method, in numpy) and its worst seed; and each seed's share of the
gap between the random policy and SB3 SAC's mean on the fully observed task.

A run's final eval is one draw: on InvertedDoublePendulum-V one seed's last six checkpoints,
1,000 updates apart, returned 1,094 to 7,529 (docs/experiments.md).  So sacbot's rows also carry
``tail``: the eval returns of its last ``--tail`` checkpoints, ``--tail-every`` updates apart (the
final one last), and the report each arm's ``tail_gap_iqm`` over the seeds' tail means, to tell a
level from a lucky or unlucky last checkpoint.  The goals are judged on the final return.

    python tools/bench/robust.py --steps 25000 --seeds 0 1 2                       # the suite
    python tools/bench/robust.py --tasks Pendulum-v1 --views full F --arms sacbot random \\
        --steps 300 --seeds 0 --episodes 1 --out /tmp/smoke.jsonl                  # a smoke run
    python tools/bench/robust.py --arms sacbot --candidate reward-input=--reward-input  # a candidate default

Progress goes to stderr; the last line of stdout is one JSON object (the report).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

TASKS = ("Pendulum-v1", "MountainCarContinuous-v0", "LunarLanderContinuous-v3", "InvertedDoublePendulum-v5")
VIEWS = ("full", "P", "V", "F")
ARMS = ("sacbot", "memoryless", "sb3", "random")
RESULTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "results", "robust.jsonl")
BOOTSTRAP = 2000  # resamples of the seeds for a confidence interval


def env_id(task: str, view: str) -> str:
    return task if view == "full" else f"sacbot/{task.rsplit('-', 1)[0]}-{view}-v0"


# --- the statistics ---------------------------------------------------------------------------
def iqm(x) -> float:
    """Interquartile mean: the mean after a quarter of the runs is cut from each end (rliable's,
    scipy's trim_mean(x, 0.25); with fewer than 4 runs nothing is cut)."""
    x = np.sort(np.asarray(x, float))
    if not len(x):
        return float("nan")
    k = int(0.25 * len(x))
    return float(x[k:len(x) - k].mean())


def bootstrap_ci(x, stat=iqm, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``stat`` over the runs (resampled with replacement)."""
    x = np.asarray(x, float)
    if len(x) < 2:
        v = float(x[0]) if len(x) else float("nan")
        return v, v
    rng = np.random.default_rng(seed)
    stats = [stat(x[rng.integers(0, len(x), len(x))]) for _ in range(n)]
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def report(rows: list[dict]) -> dict:
    """Per task and view, per arm: IQM, its interval, the worst seed; and each sacbot-side seed's
    share of the gap random -> SB3 on the fully observed task (the goal: at least 0.5)."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["task"], r["view"]), {}).setdefault(r["arm"], []).append(r)
    out: dict = {}
    for (task, view), arms in sorted(by.items()):
        cell: dict = {}
        full = by.get((task, "full"), {})
        floor = np.mean([r["return"] for r in full.get("random", [])]) if full.get("random") else None
        top = np.mean([r["return"] for r in full.get("sb3", [])]) if full.get("sb3") else None
        for arm, rs in sorted(arms.items()):
            rets = [r["return"] for r in rs]
            worst = min(rs, key=lambda r: r["return"])
            c = {"runs": len(rs), "iqm": round(iqm(rets), 2), "ci95": [round(v, 2) for v in bootstrap_ci(rets)],
                 "worst": {"seed": worst["seed"], "return": round(worst["return"], 2)}}
            if floor is not None and top is not None and top != floor and arm != "random":
                raw = {r["seed"]: (r["return"] - floor) / (top - floor) for r in rs}
                gaps = {seed: round(g, 3) for seed, g in raw.items()}
                c["gap_closed"] = gaps
                # The goals' comparisons on one scale whatever the task's rewards: 0 the random
                # policy, 1 SB3's mean on the fully observed task (a ratio of raw returns means
                # nothing when they are negative, as Pendulum's are).
                c["gap_iqm"] = round(iqm(list(raw.values())), 3)
                c["every_seed_closes_half"] = all(g >= 0.5 for g in gaps.values())
                tails = [np.mean(r["tail"]) for r in rs if r.get("tail")]
                if len(tails) == len(rs):  # only where every seed has one: rows before --tail have none
                    c["tail_gap_iqm"] = round(iqm([(t - floor) / (top - floor) for t in tails]), 3)
            cell[arm] = c
        out[f"{task} {view}"] = cell
    return out


# --- the runs ---------------------------------------------------------------------------------
def random_return(eid: str, episodes: int, seed: int) -> float:
    import gymnasium as gym
    from learning import EVAL_SEED0

    import sacbot.envs  # noqa: F401 - registers the sacbot/* ids

    env, rets = gym.make(eid), []
    env.action_space.seed(seed)
    for ep in range(episodes):
        env.reset(seed=EVAL_SEED0 + seed * 100 + ep)
        done, ret = False, 0.0
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            ret += float(r)
            done = term or trunc
        rets.append(ret)
    env.close()
    return float(np.mean(rets))


def run_one(a, task: str, view: str, arm: str, seed: int) -> tuple[float, dict] | None:
    """The eval return of one run and what else its row records (sacbot's arms: ``tail``), or None
    when its arm cannot run here (SB3 not installed)."""
    import learning as bl

    eid = env_id(task, view)
    if arm == "random":
        return random_return(eid, a.episodes, seed), {}
    if arm == "sb3":
        got = bl.sb3_curve(a, eid, seed, [a.steps])
        return None if got is None else (got["curve"][-1][1], {})
    wdir = bl.sacbot_run(a, eid, seed, memoryless=arm == "memoryless")
    from sacbot.store import checkpoint as ck

    try:
        path = os.path.join(wdir, ck.LATEST)
        rin = bool(bl.checkpoint_config(path).get("reward_input"))

        def score(p: str) -> float:
            return bl.evaluate_actor(bl.int8_actor(p), eid, a.episodes, seed, arm == "memoryless", rin)

        final = score(path)
        if a.tail <= 1:
            return final, {}
        last = int(ck.read_checkpoint(path, entries=("training",))["meta"]["grad_steps"])
        earlier = [p for step, p in ck.step_files(wdir) if step < last][-(a.tail - 1):]
        return final, {"tail": [round(score(p), 2) for p in earlier] + [final], "tail_every": a.tail_every}
    finally:
        # the run's folder, weights and run files: the row is the record; a suite of ~200 runs would keep GBs
        shutil.rmtree(os.path.dirname(wdir), ignore_errors=True)


def named(arm: str, label: str) -> str:
    """The arm's name in the results: a candidate's flags change only sacbot's own arms."""
    return f"{arm}+{label}" if label and arm in ("sacbot", "memoryless") else arm


def timed_run(a, key: tuple) -> tuple[tuple, tuple[float, dict] | None, float]:
    """One run in a worker process: its key, its return and extras (None: the arm cannot run here),
    seconds."""
    t0 = time.monotonic()
    task, view, arm, seed, _ = key
    return key, run_one(a, task, view, arm.partition("+")[0], seed), time.monotonic() - t0


def provenance() -> dict:
    """What a row says of where it was measured: the commit (``+dirty`` for local changes) and the
    processor, so that rows from several sittings and machines can be told apart."""
    root = os.path.dirname(os.path.dirname(HERE))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"commit": commit + ("+dirty" if dirty else ""), "cpu": f"{cpu} ({os.cpu_count()} cores)"}


def done_keys(path: str) -> set:
    keys = set()
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                    keys.add((r["task"], r["view"], r["arm"], r["seed"], r["steps"]))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a kill: the run is done again
    return keys


def read_rows(path: str, steps: int) -> list[dict]:
    rows = []
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict) and r.get("steps") == steps:
                    rows.append(r)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--views", nargs="+", default=list(VIEWS), choices=VIEWS)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=25_000, help="env steps per training run")
    p.add_argument("--episodes", type=int, default=10, help="eval episodes per run")
    p.add_argument("--out", default=RESULTS, help="results file, appended to (resumable); by "
                   "default the repo's own record of the suite, so that its runs add up over sittings")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (each about one core)")
    p.add_argument("--tail", type=int, default=5, help="sacbot's runs also evaluate their last N checkpoints "
                   "(the final one included; 1: the final only) and record them as the row's 'tail'")
    p.add_argument("--tail-every", type=int, default=1000, help="gradient steps between those checkpoints")
    p.add_argument("--report-only", action="store_true", help="report what --out holds; run nothing")
    p.add_argument("--candidate", metavar="LABEL=FLAGS", help="a candidate default: the sacbot and memoryless "
                   "arms run with FLAGS after --no-preset and are recorded as arms 'sacbot+LABEL' and "
                   "'memoryless+LABEL', beside the current defaults' rows (e.g. reward-input=--reward-input)")
    a = p.parse_args()
    if a.steps < 1 or a.episodes < 1 or a.jobs < 1 or a.tail < 1 or a.tail_every < 1 or any(s < 0 for s in a.seeds):
        p.error("--steps, --episodes, --jobs, --tail and --tail-every want integers >= 1, --seeds integers >= 0")
    # What bench_learning's runs read from its own arguments (saves every --tail-every steps; the
    # cadence of saves does not change what a lockstep run learns).
    a.eval_every = a.tail_every if a.tail > 1 else max(a.steps, 1)
    a.sacbot_args, a.int8_vs_fp32 = "--no-preset", False
    label = ""
    if a.candidate is not None:
        label, sep, flags = a.candidate.partition("=")
        if not sep or not label.strip() or not flags.strip() or any(c.isspace() or c == "+" for c in label):
            p.error(f"--candidate wants LABEL=FLAGS with a LABEL of no spaces or '+', e.g. "
                    f"reward-input=--reward-input; got {a.candidate!r}")
        a.sacbot_args += " " + flags.strip()
    done = done_keys(a.out)
    if not a.report_only:
        todo = [(task, view, named(arm, label), seed, a.steps) for task in a.tasks for view in a.views
                for seed in a.seeds for arm in a.arms if (task, view, named(arm, label), seed, a.steps) not in done]
        print(f"bench_robust: {len(todo)} runs to do, {a.jobs} at a time", file=sys.stderr, flush=True)
        where = provenance()

        def record(key: tuple, got: tuple[float, dict] | None, seconds: float) -> None:
            task, view, arm, seed, steps = key
            if got is None:
                print(f"bench_robust: {arm} cannot run here (pip install -e '.[bench]'); skipped", file=sys.stderr)
                return
            ret, extra = got
            row = {"task": task, "view": view, "arm": arm, "seed": seed, "steps": steps, "episodes": a.episodes,
                   "return": ret, **extra, "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d"), **where}
            with open(a.out, "a") as fh:  # the parent alone writes: one whole line per run
                fh.write(json.dumps(row) + "\n")
            tail = f", tail mean {np.mean(extra['tail']):.1f}" if extra.get("tail") else ""
            print(f"bench_robust: {task} {view} {arm} seed {seed}: {ret:.1f}{tail} ({seconds:.0f} s)", file=sys.stderr,
                  flush=True)

        if a.jobs == 1:
            for key in todo:
                record(*timed_run(a, key))
        else:
            # spawn, not fork: a worker that imports torch must not inherit a parent's threads.
            with ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) as pool:
                for f in as_completed([pool.submit(timed_run, a, key) for key in todo]):
                    record(*f.result())
    rows = read_rows(a.out, a.steps)
    print(json.dumps({"bench": "robust", "steps": a.steps, "out": a.out, "runs": len(rows), "report": report(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
