#!/usr/bin/env python3
"""PNG charts of a run directory: returns, losses and alpha, grad steps/s, act latency, drops, evals.

    python tools/plot_metrics.py runs/default            # writes runs/default/plots/*.png
    python tools/plot_metrics.py runs/default --out /tmp/plots

Reads episodes.jsonl, training_metrics.jsonl and evals.jsonl.  Needs matplotlib (the
``plot`` extra: pip install -e '.[plot]').
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import numpy as np

PANELS = ("returns", "losses", "grad_steps_per_s", "act_latency", "drops", "evals")


class PlotError(Exception):
    pass


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bad_field(rec, need: tuple, may: tuple) -> str | None:
    """Why record ``rec`` cannot be plotted: not an object, a field in ``need`` missing or not a
    number, or one in ``may`` present but not a number ("drops.other": a field of an object
    field); None if it can."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key in need + may:
        v, *sub = key.split(".")
        v = rec.get(v)
        if sub and isinstance(v, dict):
            v = v.get(sub[0])
        elif sub and v is not None:
            return f"{key.split('.')[0]!r} is not an object"
        if v is None and key in need:
            return f"no {key!r}"
        if v is not None and not _is_number(v):
            return f"{key!r} is not a number"
        if key.startswith("std") and v is not None and v < 0:  # an error bar cannot be drawn below 0 wide
            return f"{key!r} is negative"
    return None


def read_jsonl(path: str, need: tuple = (), may: tuple = ()) -> list[dict]:
    """The records of a JSONL file; a line that is not UTF-8 JSON, or not a record the panels
    can draw (see ``_bad_field``), is skipped with a message rather than stopping the plots."""
    if not os.path.exists(path):
        return []
    if not os.path.isfile(path):
        print(f"plot_metrics: skipping {path}: not a file", file=sys.stderr)
        return []
    out = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                print(f"plot_metrics: skipping malformed line {n} of {path}", file=sys.stderr)
                continue
            why = _bad_field(rec, need, may)
            if why:
                print(f"plot_metrics: skipping line {n} of {path}: {why}", file=sys.stderr)
                continue
            out.append(rec)
    return out


def moving_average(x, k: int) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    k = max(1, min(k, len(x)))
    c = np.cumsum(np.insert(x, 0, 0.0))
    head = c[1:k] / np.arange(1, k)  # the first points average what exists so far
    return np.concatenate([head, (c[k:] - c[:-k]) / k])


def figures(run_dir: str) -> dict:
    """Build one matplotlib Figure per panel.  Raises PlotError if there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = read_jsonl(os.path.join(run_dir, "episodes.jsonl"), need=("episode", "return"),
                     may=("act_p50_us", "act_p99_us", "act_max_us"))
    mets = read_jsonl(os.path.join(run_dir, "training_metrics.jsonl"),
                      may=("grad_steps", "steps", "wall_time", "critic_loss", "actor_loss", "alpha_loss", "alpha",
                           "drops.transition", "drops.other", "save_drops"))
    mets = [m for m in mets if m.get("grad_steps") is not None]
    for m in mets:  # cumulative steps: "steps" since the original's field names; "grad_steps" before
        m["total_steps"] = m["steps"] if m.get("steps") is not None else m["grad_steps"]
    evals = read_jsonl(os.path.join(run_dir, "evals.jsonl"), need=("mean_return",), may=("rounds", "std_return"))
    if not (eps or mets or evals):
        raise PlotError(f"{run_dir}: no episodes.jsonl, training_metrics.jsonl or evals.jsonl with data; "
                        "is this a sacbot run directory (--run-dir)?")
    figs = {}

    fig, ax = plt.subplots(figsize=(8, 4))
    by_opp = defaultdict(list)
    for e in eps:
        by_opp[str(e.get("opponent") or "-")].append((e["episode"], e["return"]))
    for opp, pts in sorted(by_opp.items()):
        x, y = zip(*pts)
        ax.plot(x, y, alpha=0.3, label=f"{opp} (raw)")
        ax.plot(x, moving_average(y, 20), label=f"{opp} (avg 20)")
    ax.set(title="Episode return", xlabel="episode", ylabel="return")
    figs["returns"] = fig

    fig, ax = plt.subplots(figsize=(8, 4))
    keys = ("critic_loss", "actor_loss", "alpha_loss", "alpha")
    learned = [m for m in mets if all(m.get(k) is not None for k in keys)]
    for key in keys:
        if learned:
            ax.plot([m["total_steps"] for m in learned], [m[key] for m in learned], label=key)
    ax.set(title="Losses and temperature", xlabel="gradient steps", yscale="symlog")
    figs["losses"] = fig

    fig, ax = plt.subplots(figsize=(8, 4))
    timed = [m for m in mets if m.get("wall_time") is not None]
    if len(timed) > 1:
        t = np.array([m["wall_time"] for m in timed])
        g = np.array([m["total_steps"] for m in timed])
        rate = np.diff(g) / np.maximum(np.diff(t), 1e-9)
        ax.plot(g[1:], moving_average(rate, 50), label="grad steps/s (avg 50 passes)")
    ax.set(title="Learner speed", xlabel="gradient steps", ylabel="steps/s")
    figs["grad_steps_per_s"] = fig

    fig, ax = plt.subplots(figsize=(8, 4))
    keys = ("act_p50_us", "act_p99_us", "act_max_us")
    lat = [e for e in eps if all(e.get(k) is not None for k in keys)]
    for key in keys:
        if lat:
            ax.plot([e["episode"] for e in lat], [e[key] for e in lat], label=key)
    ax.set(title="act() latency per episode", xlabel="episode", ylabel="µs", yscale="log" if lat else "linear")
    figs["act_latency"] = fig

    fig, ax = plt.subplots(figsize=(8, 4))
    if mets:
        g = [m["total_steps"] for m in mets]
        ax.plot(g, [(m.get("drops") or {}).get("transition") or 0 for m in mets], label="transitions dropped")
        ax.plot(g, [(m.get("drops") or {}).get("other") or 0 for m in mets], label="other messages dropped")
        ax.plot(g, [m.get("save_drops") or 0 for m in mets], label="save offers dropped")
    ax.set(title="Drops (cumulative)", xlabel="gradient steps", ylabel="count")
    figs["drops"] = fig

    fig, ax = plt.subplots(figsize=(8, 4))
    if evals:
        x = [i if e.get("rounds") is None else e["rounds"] for i, e in enumerate(evals)]
        y = np.array([e["mean_return"] for e in evals], dtype=float)
        s = np.array([e.get("std_return") or 0.0 for e in evals], dtype=float)
        ax.errorbar(x, y, yerr=s, marker="o", capsize=3, label="eval mean ± std")
    ax.set(title="Eval return", xlabel="rounds", ylabel="return")
    figs["evals"] = fig

    for f in figs.values():
        for a in f.axes:
            if a.get_legend_handles_labels()[0]:
                a.legend(fontsize=7)
            else:
                a.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=a.transAxes)
        f.tight_layout()
    return figs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("--out", help="directory for the PNGs (default RUN_DIR/plots)")
    a = p.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_metrics: matplotlib is not installed; install the plot extra: pip install -e '.[plot]'",
              file=sys.stderr)
        return 2
    if not os.path.isdir(a.run_dir):
        print(f"plot_metrics: {a.run_dir} is not a directory", file=sys.stderr)
        return 2
    out = a.out or os.path.join(a.run_dir, "plots")
    # Before the figures are drawn: a file where the PNGs' directory should be is the user's to move.
    if os.path.exists(out) and not os.path.isdir(out):
        print(f"plot_metrics: {out} exists and is not a directory; --out wants a directory for the PNGs",
              file=sys.stderr)
        return 2
    try:
        figs = figures(a.run_dir)
    except PlotError as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 1
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        print(f"plot_metrics: cannot make the directory {out} for the PNGs: {e}", file=sys.stderr)
        return 1
    for name, fig in figs.items():
        path = os.path.join(out, f"{name}.png")
        fig.savefig(path, dpi=90)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
