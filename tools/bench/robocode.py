#!/usr/bin/env python3
"""A Robocode bot trained from scratch against sample robots for a wall-clock budget, then scored
over eval rounds against each, everything counted by Robocode's own results files.

Training is ``sacbot robocode --rounds R`` run again and again (one battle of R rounds each, the
opponents of ``--opponent`` in turn; the bot resumes from its newest checkpoint every time) until
``--minutes`` have passed; then ``sacbot robocode --eval --rounds E`` plays the newest checkpoint
deterministically against each opponent.  Each battle's line (rounds won, turns, the learner's
totals) is kept in ROOT/<bot>/run/robocode.jsonl, which is the learning curve: win rate against
rounds and env steps.

    python tools/bench/robocode.py --opponent sample.SittingDuck --minutes 60 --root runs/rc-duck
    python tools/bench/robocode.py --opponent sample.SittingDuck --minutes 40 --hold-ms 40   # held
    python tools/bench/robocode.py --minutes 60 --rounds 50 --root runs/rc-mix \
        --opponent sample.SittingDuck,sample.Walls,sample.SittingDuck,sample.SpinBot,sample.SittingDuck,sample.Tracker

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

SACBOT = [sys.executable, "-m", "sacbot"]


def battle(args: list[str], timeout: float) -> dict:
    p = subprocess.run(SACBOT + ["robocode", *args], capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"sacbot robocode {' '.join(args)} exited {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


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
    a = ap.parse_args(argv)
    cycle = [o.strip() for o in a.opponent.split(",") if o.strip()]
    if not cycle:
        ap.error("--opponent names no robot")
    opponents = list(dict.fromkeys(cycle))  # each once, in order of first mention
    t0 = time.monotonic()
    battles = 0
    while time.monotonic() - t0 < a.minutes * 60:
        opponent = cycle[battles % len(cycle)]
        battle(["--root", a.root, "--opponents", opponent, "--rounds", str(a.rounds), "--hold-ms", a.hold_ms] + extra,
               timeout=3 * 3600)
        battles += 1
        print(f"[{(time.monotonic() - t0) / 60:.1f} min] {battles} battles", file=sys.stderr, flush=True)
    train_s = time.monotonic() - t0
    lines = [json.loads(x) for x in open(os.path.join(a.root, "robocode", "run", "robocode.jsonl"))]
    lines = [x for x in lines if x.get("opponent") in opponents]  # eval battles write no line there
    ev = battle(["--root", a.root, "--opponents", ",".join(opponents), "--rounds", str(a.eval_rounds), "--eval"]
                + extra, timeout=3 * 3600)
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
