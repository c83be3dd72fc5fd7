"""Robocode's results file (``-results FILE``) and the robot's per-round stats lines, parsed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# "1st: sample.Walls\t1804 (100%)\t500\t100\t996\t200\t8\t0\t10\t0\t0\t"
_ROW = re.compile(r"^\s*(\d+)(?:st|nd|rd|th):\s+(.+?)\s*\t\s*(-?\d+)(?:\s+\((\d+)%\))?\s*\t(.*)$")


class ResultsError(ValueError):
    pass


@dataclass
class Row:
    rank: int
    name: str
    score: int
    score_pct: int | None
    firsts: int
    seconds: int


def parse_results(text: str) -> tuple[int, list[Row]]:
    """``(rounds, rows)`` from the results file; ResultsError when it is not one."""
    lines = text.splitlines()
    m = re.match(r"^Results for (\d+) rounds?\b", lines[0].strip()) if lines else None
    if not m:
        raise ResultsError(f"not a Robocode results file: it starts {lines[0][:60]!r}" if lines else
                           "the results file is empty")
    rows = []
    for line in lines[2:]:
        if not line.strip():
            continue
        r = _ROW.match(line)
        if not r:
            raise ResultsError(f"unexpected line in the results file: {line!r}")
        cols = [c.strip() for c in r.group(5).split("\t") if c.strip()]
        if len(cols) < 9:
            raise ResultsError(f"expected 10 columns after the name, got {len(cols) + 1}: {line!r}")
        # Survival, Surv Bonus, Bullet Dmg, Bullet Bonus, Ram Dmg * 2, Ram Bonus, 1sts, 2nds, 3rds
        rows.append(Row(int(r.group(1)), r.group(2), int(r.group(3)),
                        None if r.group(4) is None else int(r.group(4)), int(cols[6]), int(cols[7])))
    if not rows:
        raise ResultsError("the results file lists no robot")
    return int(m.group(1)), rows


def robot_row(rows: list[Row], name: str) -> Row:
    for row in rows:
        if row.name.rstrip("*").split(" ")[0] == name:
            return row
    raise ResultsError(f"{name} is not in the results ({', '.join(r.name for r in rows)})")


def shooting(played: list[dict]) -> dict:
    """The robot's shooting over the rounds of its lines: bullets fired, hits, the hit rate, the mean aim
    error in degrees (how far the gun was from the enemy's lead at each shot, over the shots fired with the
    enemy seen), the shots fired before any scan, and the energy spent on bullets."""
    shots, hits = sum(int(r.get("shots", 0)) for r in played), sum(int(r.get("hits", 0)) for r in played)
    blind = sum(int(r.get("blind_shots", 0)) for r in played)
    aimed = shots - blind
    return {"shots": shots, "hits": hits, "hit_rate": round(hits / shots, 4) if shots else None,
            "aim_error_deg": round(sum(float(r.get("aim_deg_sum", 0.0)) for r in played) / aimed, 3) if aimed else None,
            "blind_shots": blind, "fire_energy": round(sum(float(r.get("fire_energy", 0.0)) for r in played), 2)}


def describe_shooting(s: dict) -> str:
    """One phrase for a battle's line from :func:`shooting`'s figures."""
    if not s["shots"]:
        return "no shots fired"
    aim = f", mean aim error {s['aim_error_deg']:.1f} deg" if s["aim_error_deg"] is not None else ""
    return f"{s['shots']} shots, {s['hits']} hits ({s['hit_rate']:.0%}){aim}"


def read_stats(path: str) -> list[dict]:
    """The robot's lines, one a round it played (the robot writes them; a torn last line is skipped)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out
