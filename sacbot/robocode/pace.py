"""Robocode's pace with the sacbot robot against the same battle with a sample robot in its place:
turns per second of each, through Robocode's control API (clients/robocode/tools/PaceProbe.java), and
the robot's skipped turns and reply timeouts.  Learning as ``sacbot robocode`` learns (a fresh bot).

    python -m sacbot.robocode.pace --rounds 20 --opponent sample.SittingDuck --stand-in sample.SpinBot
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from sacbot.robocode import ROBOT_ENTRY
from sacbot.robocode.command import Serve, _free_port
from sacbot.robocode.install import ADD_OPENS, REPO, find_install, prepare_workdir
from sacbot.robocode.results import read_stats

PROBE = os.path.join(REPO, "clients", "robocode", "tools", "PaceProbe.java")


def probe(inst, workdir: str, classes: str, rounds: int, robots: str, props: dict[str, str]) -> dict:
    cmd = [inst.java, "-Xmx512M", "-Djava.awt.headless=true", "-DNOSECURITY=true", *ADD_OPENS,
           f"-DWORKINGDIRECTORY={workdir}", *(f"-D{k}={v}" for k, v in props.items()),
           "-cp", os.pathsep.join([inst.jar, inst.msgpack_jar, classes]), "PaceProbe", workdir, str(rounds), robots]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"PaceProbe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sacbot.robocode.pace", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--opponent", default="sample.SittingDuck")
    p.add_argument("--stand-in", default="sample.SpinBot", help="the sample robot in the sacbot robot's place")
    p.add_argument("--turn-budget-ms", type=float, default=100.0)
    p.add_argument("--reply-ms", type=int, default=80)
    p.add_argument("--hold-ms", type=float, default=0.0,
                   help="sacbot serve --hold-ms (default 0, as sacbot robocode: the battle runs free)")
    a, extra = p.parse_known_args(argv)
    extra = extra[1:] if extra[:1] == ["--"] else extra
    inst = find_install()
    with tempfile.TemporaryDirectory(prefix="sacbot-robocode-pace-") as tmp:
        workdir, classes = os.path.join(tmp, "robocode"), os.path.join(tmp, "probe")
        prepare_workdir(inst, workdir, a.turn_budget_ms)
        subprocess.run([inst.javac, "-cp", inst.jar, "-d", classes, PROBE], check=True, timeout=300)
        port, stats = _free_port(), os.path.join(tmp, "rounds.jsonl")
        serve = Serve(os.path.join(tmp, "serve"), port, False, a.hold_ms, extra, os.path.join(tmp, "serve.log"))
        try:
            serve.warm("pace")
            props = {"sacbot.port": str(port), "sacbot.bot": "pace", "sacbot.opponent": a.opponent,
                     "sacbot.replyMs": str(a.reply_ms), "sacbot.helloMs": "5000", "sacbot.stats": stats}
            mine = probe(inst, workdir, classes, a.rounds, f"{ROBOT_ENTRY},{a.opponent}", props)
        finally:
            serve.stop()
        theirs = probe(inst, workdir, classes, a.rounds, f"{a.stand_in},{a.opponent}", {})
        played = read_stats(stats)
        out = {"sacbot": mine, "stand_in": theirs, "ratio": round(mine["turns_per_s"] / theirs["turns_per_s"], 4),
               "in_round_ratio": round(mine["in_round_turns_per_s"] / theirs["in_round_turns_per_s"], 4),
               "skipped_turns": sum(r["skipped"] for r in played), "reply_timeouts": sum(r["timeouts"] for r in played),
               # Robocode's own words from the robot's console (PaceProbe): turns skipped while alive, rounds
               # stopped for skipping turns while alive and after its death (then nothing was lost but the wait).
               "skipped_alive": mine["skipped_alive"], "stopped_alive": mine["stopped_alive"],
               "stopped_after_death": mine["stopped_dead"], "rounds_finished_late": sum(1 for r in played
                                                                                       if r.get("stopped")),
               "max_reply_ms": max((r["max_reply_ms"] for r in played), default=None),
               "turn_budget_ms": a.turn_budget_ms, "reply_ms": a.reply_ms, "hold_ms": a.hold_ms}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
