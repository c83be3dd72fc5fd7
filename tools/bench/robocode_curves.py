#!/usr/bin/env python3
"""Robocode learning curves of several runs of tools/bench/robocode.py --curve-every, side by side.

Each run's ROOT/curve.jsonl holds its eval points: after so many training rounds and env steps, the
rounds won in eval mode against each opponent.  This draws one column per opponent, win rate against
training rounds (top) and env steps (bottom), a line per run coloured by its arm (sacbot or
--memoryless), and prints one JSON line: each arm's final eval (the last point of each run) per
opponent and over all of them, and the difference of the two arms' pooled final win rates with its
standard error (two independent proportions).

    python tools/bench/robocode_curves.py runs/rc-curve-* --out docs/img/robocode-curves.png

Needs matplotlib (the plot extra).  Exit 2 when a ROOT has no curve.jsonl or a line is not one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

NEED = ("arm", "battles", "train_rounds", "env_steps", "opponent", "rounds", "wins")
COLORS = {"sacbot": "tab:blue", "memoryless": "tab:orange"}


class CurveError(ValueError):
    pass


def read_curve(root: str) -> list[dict]:
    path = os.path.join(root, "curve.jsonl")
    if not os.path.exists(path):
        raise CurveError(f"{root}: no curve.jsonl (made by tools/bench/robocode.py --curve-every N)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CurveError(f"{path}:{i}: not JSON ({e.msg})") from None
            missing = [k for k in NEED if not isinstance(row, dict) or k not in row]
            if missing:
                raise CurveError(f"{path}:{i}: a curve point needs {', '.join(missing)}")
            rows.append(row)
    if not rows:
        raise CurveError(f"{path}: empty")
    return rows


def finals(runs: dict[str, list[dict]]) -> dict:
    """Each arm's final eval (the last point of each run): wins and rounds per opponent and pooled, and the
    difference of sacbot's pooled rate and the memoryless control's with its standard error."""
    arms: dict[str, dict] = defaultdict(lambda: {"runs": 0, "by_opponent": defaultdict(lambda: [0, 0])})
    for rows in runs.values():
        last = max(r["battles"] for r in rows)
        arm = arms[rows[0]["arm"]]
        arm["runs"] += 1
        for r in rows:
            if r["battles"] == last:
                arm["by_opponent"][r["opponent"]][0] += r["wins"]
                arm["by_opponent"][r["opponent"]][1] += r["rounds"]
    out: dict = {}
    for name, arm in arms.items():
        wins = sum(w for w, _ in arm["by_opponent"].values())
        rounds = sum(n for _, n in arm["by_opponent"].values())
        out[name] = {"runs": arm["runs"], "by_opponent": {o: {"wins": w, "rounds": n, "rate": round(w / n, 3)}
                                                           for o, (w, n) in arm["by_opponent"].items()},
                     "wins": wins, "rounds": rounds, "rate": round(wins / rounds, 3)}
    if "sacbot" in out and "memoryless" in out:
        a, b = out["sacbot"], out["memoryless"]
        pa, pb = a["wins"] / a["rounds"], b["wins"] / b["rounds"]
        se = math.sqrt(pa * (1 - pa) / a["rounds"] + pb * (1 - pb) / b["rounds"])
        out["difference"] = {"sacbot_minus_memoryless": round(pa - pb, 3), "se": round(se, 3),
                             "beyond_2_se": abs(pa - pb) > 2 * se}
    return out


def draw(runs: dict[str, list[dict]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opponents = list(dict.fromkeys(r["opponent"] for rows in runs.values() for r in rows))
    fig, grid = plt.subplots(2, len(opponents), figsize=(3.6 * len(opponents), 6.4), squeeze=False, sharey=True)
    seen = set()
    for rows in runs.values():
        arm = rows[0]["arm"]
        for j, opp in enumerate(opponents):
            pts = sorted((r for r in rows if r["opponent"] == opp), key=lambda r: r["battles"])
            for i, x in enumerate(("train_rounds", "env_steps")):
                grid[i][j].plot([p[x] for p in pts], [p["wins"] / p["rounds"] for p in pts], marker="o", ms=3,
                                color=COLORS.get(arm, "tab:gray"), alpha=0.8,
                                label=arm if (arm not in seen and i == j == 0) else None)
        seen.add(arm)
    for j, opp in enumerate(opponents):
        grid[0][j].set(title=opp.removeprefix("sample."), xlabel="training rounds")
        grid[1][j].set(xlabel="env steps")
    for i in range(2):
        grid[i][0].set_ylabel("eval rounds won")
        grid[i][0].set_ylim(-0.05, 1.05)
    grid[0][0].legend(fontsize=8)
    fig.suptitle(f"sacbot in Robocode: eval win rate while training ({len(runs)} runs)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", metavar="ROOT", help="a --root of tools/bench/robocode.py --curve-every")
    ap.add_argument("--out", help="the PNG to write (default: none, only the JSON line)")
    a = ap.parse_args(argv)
    try:
        runs = {root: read_curve(root) for root in a.roots}
    except (CurveError, OSError) as e:
        print(f"robocode_curves: {e}", file=sys.stderr)
        return 2
    if a.out:
        try:
            draw(runs, a.out)
        except ImportError:
            print("robocode_curves: --out needs matplotlib: pip install 'sacbot[plot]'", file=sys.stderr)
            return 2
    print(json.dumps({"runs": len(runs), "out": a.out, "finals": finals(runs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
