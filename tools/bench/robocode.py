#!/usr/bin/env python3
"""A Robocode bot trained from scratch against sample robots for a wall-clock budget, then scored
over eval rounds against each, everything counted by Robocode's own results files.

Training is ``sacbot robocode --rounds R`` run again and again (one battle of R rounds each, the
opponents of ``--opponent`` in turn; the bot resumes from its newest checkpoint every time) until
``--minutes`` have passed; then ``sacbot robocode --eval --rounds E`` plays the newest checkpoint
deterministically against each opponent.  Each battle's line (rounds won, turns, the learner's
totals) is kept in ROOT/<bot>/run/robocode.jsonl, which is the learning curve against the training
opponents: win rate against rounds and env steps.  With ``--curve-every N`` the newest checkpoint is
also played in eval mode against each of ``--curve-opponents`` after every N training battles (and at
the end), one line per opponent in ROOT/curve.jsonl: the curve against opponents it may never have
trained on.  ``tools/bench/robocode_curves.py`` draws those files of several runs.

    python tools/bench/robocode.py --opponent sample.SittingDuck --minutes 60 --root runs/rc-duck
    python tools/bench/robocode.py --opponent sample.SittingDuck --minutes 40 --hold-ms 40   # held
    python tools/bench/robocode.py --minutes 60 --rounds 50 --root runs/rc-mix \
        --opponent sample.SittingDuck,sample.Walls,sample.SittingDuck,sample.SpinBot,sample.SittingDuck,sample.Tracker
    python tools/bench/robocode.py --minutes 10 --rounds 50 --curve-every 15 --eval-rounds 20 \
        --root runs/rc-curve-m0 -- --memoryless --seed 0            # one run of the learning curves

Flags after -- go on to sacbot serve (e.g. -- --seed 3).
Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from sacbot.robocode import GUNS, REWARDS

SACBOT = [sys.executable, "-m", "sacbot"]


def battle(args: list[str], timeout: float) -> dict:
    p = subprocess.run(SACBOT + ["robocode", *args], capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"sacbot robocode {' '.join(args)} exited {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


ALL = ("sample.SittingDuck", "sample.SpinBot", "sample.Walls", "sample.Tracker")


def training_lines(root: str) -> list[dict]:
    """Each training battle's line (eval battles write none)."""
    path = os.path.join(root, "robocode", "run", "robocode.jsonl")
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


class Curve:
    """Eval battles between training battles, one JSON line per opponent in ROOT/curve.jsonl: the bot's
    training so far (battles, rounds, env steps) and its eval rounds won against that opponent."""

    def __init__(self, root: str, extra: list[str], opponents: str):
        self.path, self.extra, self.opponents = os.path.join(root, "curve.jsonl"), extra, opponents
        self.arm = "memoryless" if "--memoryless" in extra else "sacbot"
        self.seed = extra[extra.index("--seed") + 1] if "--seed" in extra[:-1] else None
        self.eval_s = 0.0

    def add(self, battles: int, train_s: float, rounds: int) -> None:
        t = time.monotonic()
        ev = battle(["--root", os.path.dirname(self.path) or ".", "--opponents", self.opponents,
                     "--rounds", str(rounds), "--eval"] + self.extra, timeout=3 * 3600)
        self.eval_s += time.monotonic() - t
        self.write(battles, train_s, ev)

    def write(self, battles: int, train_s: float, ev: dict) -> None:
        lines = training_lines(os.path.dirname(self.path) or ".")
        status = lines[-1].get("server", {}) if lines else {}
        with open(self.path, "a", encoding="utf-8") as f:
            for b in ev["battles"]:
                f.write(json.dumps({
                    "arm": self.arm, "seed": self.seed, "battles": battles,
                    "train_rounds": sum(x["rounds"] for x in lines),
                    "train_wins": sum(x["wins"] for x in lines),
                    "env_steps": status.get("env_steps_received"), "learner_steps": status.get("learner_steps"),
                    "train_minutes": round(train_s / 60, 2), **b,
                    "win_rate": b["wins"] / b["rounds"] if b["rounds"] else None}) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opponent", default="sample.SittingDuck",
                    help="a sample robot, or several comma-separated: the training battles take them in turn "
                         "(default sample.SittingDuck)")
    ap.add_argument("--minutes", type=float, default=60.0, help="training budget, wall clock (default 60)")
    ap.add_argument("--rounds", type=int, default=200,
                    help="rounds per training battle (default 200; each battle starts a JVM and a server, ~20 s)")
    ap.add_argument("--eval-rounds", type=int, default=100, help="eval rounds at the end (default 100)")
    ap.add_argument("--root", default="runs/robocode-bench")
    ap.add_argument("--hold-ms", default="0", help="sacbot robocode --hold-ms for the training battles (default 0)")
    ap.add_argument("--reward", choices=REWARDS, default=REWARDS[0],
                    help=f"sacbot robocode --reward for the training battles (default {REWARDS[0]})")
    ap.add_argument("--gun", choices=GUNS, default=None,
                    help="sacbot robocode --gun for the training battles (default: the bot's, or gated for a new one)")
    ap.add_argument("--curve-every", type=int, default=0, metavar="N",
                    help="after every N training battles, play --curve-rounds eval rounds against each of "
                         "--curve-opponents and append them to ROOT/curve.jsonl, with the final eval (default 0: "
                         "only the final eval, not written there)")
    ap.add_argument("--curve-rounds", type=int, default=10, help="eval rounds per opponent at each curve point")
    ap.add_argument("--curve-opponents", default=",".join(ALL),
                    help="the opponents of each curve point (default the four sample robots)")
    a = ap.parse_args(argv)
    if a.curve_every < 0 or a.curve_rounds < 1:
        ap.error("--curve-every must be 0 or more and --curve-rounds 1 or more")
    cycle = [o.strip() for o in a.opponent.split(",") if o.strip()]
    if not cycle:
        ap.error("--opponent names no robot")
    opponents = list(dict.fromkeys(cycle))  # each once, in order of first mention
    point = Curve(a.root, extra, a.curve_opponents)
    t0 = time.monotonic()
    battles = 0
    def trained() -> float:  # seconds of training so far: the curve's eval battles are not training
        return time.monotonic() - t0 - point.eval_s

    while trained() < a.minutes * 60:
        opponent = cycle[battles % len(cycle)]
        battle(["--root", a.root, "--opponents", opponent, "--rounds", str(a.rounds), "--hold-ms", a.hold_ms,
                "--reward", a.reward] + (["--gun", a.gun] if a.gun else []) + extra,
               timeout=3 * 3600)
        battles += 1
        print(f"[{trained() / 60:.1f} min trained] {battles} battles", file=sys.stderr, flush=True)
        if a.curve_every and battles % a.curve_every == 0 and trained() < a.minutes * 60:
            point.add(battles, trained(), a.curve_rounds)
    train_s = trained()
    lines = training_lines(a.root)
    lines = [x for x in lines if x.get("opponent") in opponents]
    final = a.curve_opponents if a.curve_every else ",".join(opponents)  # a curve ends on its final point
    ev = battle(["--root", a.root, "--opponents", final, "--rounds", str(a.eval_rounds), "--eval"]
                + extra, timeout=3 * 3600)
    if a.curve_every:
        point.write(battles, train_s, ev)
    last = lines[-1].get("server", {})
    per = {o: [x for x in lines if x["opponent"] == o] for o in opponents}
    print(json.dumps({
        "opponents": cycle, "train_minutes": round(train_s / 60, 1), "battles": battles,
        "train_rounds": sum(x["rounds"] for x in lines), "train_wins": sum(x["wins"] for x in lines),
        "train_wins_by_opponent": {o: [sum(x["wins"] for x in v), sum(x["rounds"] for x in v)] for o, v in per.items()},
        "last_battle_win_rate": lines[-1]["win_rate"], "env_steps_received": last.get("env_steps_received"),
        "learner_steps": last.get("learner_steps"), "drops": last.get("drops"),
        "rounds_disabled": sum(x.get("rounds_disabled", 0) for x in lines),
        "eval_rounds": a.eval_rounds, "eval_win_rates": ev["win_rates"],
        # each battle: its opponent, rounds, wins, and the env steps the server had received by its end
        "curve": [[x["opponent"], x["rounds"], x["wins"], x.get("server", {}).get("env_steps_received")]
                  for x in lines]}))


if __name__ == "__main__":
    main()
