"""``sacbot plot RUN_DIR [RUN_DIR ...]``: one overview image of a run, or of several overlaid.

    sacbot plot runs/default                      # runs/default/plots/overview.png
    sacbot plot runs/a runs/b --out ab.png        # both runs on the same axes, one colour each

Ten panels, each quantity on its own axis: the return and the win rate per opponent against env
steps (as SB3's and CleanRL's curves are drawn, so they can be laid over them), the critic loss,
the actor loss, the temperature's loss and the temperature against gradient steps, the learner's
gradient steps/s, the drops, act() latency per episode, and the runner's evals.  Reads
``episodes.jsonl``, ``training_metrics.jsonl`` and ``evals.jsonl``; a line it cannot draw is
skipped with a message naming it.  Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict

import numpy as np

log = logging.getLogger("sacbot")
PANELS = ("return", "win rate", "critic loss", "actor loss", "alpha loss", "alpha", "gradient steps/s",
          "drops", "act() latency", "eval return")
WINDOW = 20  # episodes in a moving average or a win rate


class PlotError(Exception):
    """Nothing to plot, or nowhere to write it: the message says which (exit 1)."""


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _bad_field(rec, need: tuple, may: tuple) -> str | None:
    """Why ``rec`` cannot be drawn: not an object, a field in ``need`` missing or not a number, or
    one in ``may`` present but not a number ("drops.other": a field of an object field)."""
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
    """The records of a JSONL file; a line that is not UTF-8 JSON, or not a record the panels can
    draw (``_bad_field``), is skipped with a message rather than stopping the plot."""
    if not os.path.exists(path):
        return []
    if not os.path.isfile(path):
        log.warning("plot: skipping %s: not a file", path)
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
                log.warning("plot: skipping malformed line %d of %s", n, path)
                continue
            why = _bad_field(rec, need, may)
            if why:
                log.warning("plot: skipping line %d of %s: %s", n, path, why)
                continue
            out.append(rec)
    return out


def moving_average(x, k: int) -> np.ndarray:
    """Mean of the last ``k`` values at each point; the first points average what exists so far."""
    x = np.asarray(x, dtype=float)
    if not len(x):
        return x
    k = max(1, min(k, len(x)))
    c = np.cumsum(np.insert(x, 0, 0.0))
    head = c[1:k] / np.arange(1, k)
    return np.concatenate([head, (c[k:] - c[:-k]) / k])


def read_run(run_dir: str) -> dict:
    """A run directory's records, with each episode's env step (its ``env_steps`` field, or the
    running sum of episode lengths for a run written before that field) and each metrics line's
    cumulative gradient steps."""
    eps = read_jsonl(os.path.join(run_dir, "episodes.jsonl"), need=("episode", "return"),
                     may=("length", "env_steps", "act_p50_us", "act_p99_us", "act_max_us"))
    total = 0
    for e in eps:
        total += int(e.get("length") or 0)
        e["x"] = e["env_steps"] if e.get("env_steps") is not None else total
    mets = read_jsonl(os.path.join(run_dir, "training_metrics.jsonl"),
                      may=("grad_steps", "steps", "wall_time", "critic_loss", "actor_loss", "alpha_loss", "alpha",
                           "drops.transition", "drops.other", "save_drops"))
    mets = [m for m in mets if m.get("grad_steps") is not None]
    for m in mets:  # cumulative: "steps" since the original's field names, "grad_steps" before them
        m["total_steps"] = m["steps"] if m.get("steps") is not None else m["grad_steps"]
    evals = read_jsonl(os.path.join(run_dir, "evals.jsonl"), need=("mean_return",), may=("rounds", "std_return"))
    if not (eps or mets or evals):
        raise PlotError(f"{run_dir}: no episodes.jsonl, training_metrics.jsonl or evals.jsonl with data; "
                        "is this a sacbot run directory (--run-dir)?")
    return {"episodes": eps, "metrics": mets, "evals": evals}


def _labels(run_dirs: list[str]) -> list[str]:
    names = [os.path.basename(os.path.normpath(d)) or d for d in run_dirs]
    return names if len(set(names)) == len(names) else [os.path.normpath(d) for d in run_dirs]


def _draw_run(axes: dict, run: dict, label: str, color, several: bool) -> None:
    eps, mets = run["episodes"], run["metrics"]
    name = (lambda what: f"{label}: {what}") if several else (lambda what: what)
    by_opp: dict[str, list[dict]] = defaultdict(list)
    for e in eps:
        by_opp[str(e.get("opponent") or "all")].append(e)
    styles = ("-", "--", ":", "-.")
    for i, (opp, es) in enumerate(sorted(by_opp.items())):
        x = [e["x"] for e in es]
        axes["return"].plot(x, moving_average([e["return"] for e in es], WINDOW), styles[i % 4], color=color,
                            label=name(opp))
        won = [e for e in es if isinstance(e.get("won"), bool)]
        if won:
            axes["win rate"].plot([e["x"] for e in won], moving_average([float(e["won"]) for e in won], WINDOW),
                                  styles[i % 4], color=color, label=name(opp))
    for key, panel in (("critic_loss", "critic loss"), ("actor_loss", "actor loss"), ("alpha_loss", "alpha loss"),
                       ("alpha", "alpha")):
        pts = [(m["total_steps"], m[key]) for m in mets if m.get(key) is not None]
        if pts:
            axes[panel].plot(*zip(*pts), color=color, label=name(key))
    timed = [m for m in mets if m.get("wall_time") is not None]
    if len(timed) > 1:
        t = np.array([m["wall_time"] for m in timed])
        g = np.array([m["total_steps"] for m in timed])
        rate = np.diff(g) / np.maximum(np.diff(t), 1e-9)
        axes["gradient steps/s"].plot(g[1:], moving_average(rate, 50), color=color, label=name("avg of 50 passes"))
    if mets:
        g = [m["total_steps"] for m in mets]
        for what, get, style in (("transitions", lambda m: (m.get("drops") or {}).get("transition"), "-"),
                                 ("other messages", lambda m: (m.get("drops") or {}).get("other"), "--"),
                                 ("save offers", lambda m: m.get("save_drops"), ":")):
            axes["drops"].plot(g, [get(m) or 0 for m in mets], style, color=color, label=name(what))
    lat = [e for e in eps if e.get("act_p99_us") is not None]
    if lat:
        axes["act() latency"].plot([e["x"] for e in lat], [e["act_p99_us"] for e in lat], color=color,
                                   label=name("p99"))
    if run["evals"]:
        ev = run["evals"]
        x = [i if e.get("rounds") is None else e["rounds"] for i, e in enumerate(ev)]
        axes["eval return"].errorbar(x, [e["mean_return"] for e in ev], yerr=[e.get("std_return") or 0.0 for e in ev],
                                     marker="o", capsize=3, color=color, label=name("mean ± std"))


def overview(run_dirs: list[str]):
    """The overview Figure of the runs (PlotError if one has nothing to plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_run(d) for d in run_dirs]
    fig, grid = plt.subplots(5, 2, figsize=(13, 17))
    axes = dict(zip(PANELS, grid.flat))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, label) in enumerate(zip(runs, _labels(run_dirs))):
        _draw_run(axes, run, label, colors[i % len(colors)], len(runs) > 1)
    units = {"return": ("env steps", f"return (avg of {WINDOW})"),
             "win rate": ("env steps", f"won (last {WINDOW})"),
             "critic loss": ("gradient steps", ""), "actor loss": ("gradient steps", ""),
             "alpha loss": ("gradient steps", ""), "alpha": ("gradient steps", ""),
             "gradient steps/s": ("gradient steps", "steps/s"), "drops": ("gradient steps", "cumulative"),
             "act() latency": ("env steps", "µs"), "eval return": ("runner rounds", "return")}
    for panel, ax in axes.items():
        ax.set(title=panel, xlabel=units[panel][0], ylabel=units[panel][1])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if axes["win rate"].lines:
        axes["win rate"].set_ylim(-0.05, 1.05)
    if axes["alpha"].lines:
        axes["alpha"].set_yscale("log")
    fig.suptitle("sacbot: " + ", ".join(_labels(run_dirs)))
    fig.tight_layout()
    return fig


def output_path(run_dirs: list[str], out: str | None) -> str:
    """Where the PNG goes: ``--out``, or RUN_DIR/plots/overview.png for one run."""
    if out is None:
        if len(run_dirs) > 1:
            raise ValueError("several runs need --out FILE.png for their overlaid overview")
        return os.path.join(run_dirs[0], "plots", "overview.png")
    if os.path.isdir(out):
        raise ValueError(f"--out {out!r} is a directory; expected the path of the PNG file to write")
    return out


def plot(run_dirs: list[str], out: str | None) -> str:
    """Write the overview PNG; returns its path.  ValueError for bad arguments (exit 2),
    PlotError for a run with nothing to plot or a file that cannot be written (exit 1)."""
    for d in run_dirs:
        if not os.path.isdir(d):
            raise ValueError(f"{d!r} is not a directory; expected a run directory (--run-dir of sacbot run)")
    path = output_path(run_dirs, out)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("sacbot plot needs matplotlib: pip install 'sacbot[plot]'") from None
    fig = overview(run_dirs)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=80)
    except OSError as e:
        raise PlotError(f"cannot write {path}: {e.strerror or e}") from None
    return path
