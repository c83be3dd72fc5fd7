"""Robocode's results file read as Robocode 1.9 writes it (no Robocode needed)."""

from __future__ import annotations

import pytest

from sacbot.robocode.results import ResultsError, parse_results, robot_row

HEAD = ("Robot Name\t    Total Score    \tSurvival\tSurv Bonus\tBullet Dmg\tBullet Bonus\tRam Dmg * 2\tRam Bonus\t"
        " 1sts \t 2nds \t 3rds \t\n")


def results(rounds_line: str) -> str:
    return (rounds_line + "\n" + HEAD
            + "1st: sample.SittingDuck\t120 (69%)\t100\t20\t0\t0\t0\t0\t2\t0\t0\t\n"
            + "2nd: sacbot.SacbotRobot*\t54 (31%)\t0\t0\t54\t0\t0\t0\t0\t2\t0\t\n")


@pytest.mark.parametrize("line, rounds", [("Results for 2 rounds", 2), ("Results for 1 round", 1),
                                          ("Results for 100000 rounds", 100000)])
def test_the_rounds_and_each_robots_wins_and_score(line, rounds):
    n, rows = parse_results(results(line))
    assert n == rounds
    me = robot_row(rows, "sacbot.SacbotRobot")
    assert (me.rank, me.score, me.score_pct, me.firsts, me.seconds) == (2, 54, 31, 0, 2)
    assert robot_row(rows, "sample.SittingDuck").firsts == 2


@pytest.mark.parametrize("text, says", [("", "empty"), ("Results for two rounds\n", "not a Robocode results file"),
                                        ("Results for 2 roundsx\n", "not a Robocode results file"),
                                        ("Results for 2 rounds\n" + HEAD, "lists no robot")])
def test_what_is_not_a_results_file_is_named(text, says):
    with pytest.raises(ResultsError, match=says):
        parse_results(text)
