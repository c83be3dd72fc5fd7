"""tools/bench/robocode_scripted.py: a hand-written policy on the Robocode robot's own observation and action
(clients/robocode/tools/ScriptedRobot.java) beats sample.Walls standing still.  It hits a robot moving at full
speed along the walls only if the observation's angle to the lead (o[19]) and the action's gun and fire
mapping are right, so this checks both in the real game.  Skipped where Robocode is not installed
(./tools/setup.sh robocode)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import robocode_missing

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench" / "robocode_scripted.py"
pytestmark = [pytest.mark.xdist_group("robocode"), pytest.mark.alone]
MISSING = robocode_missing()


@pytest.mark.timeout(180)
@pytest.mark.skipif(MISSING is not None, reason=f"needs Robocode: {MISSING}")
@pytest.mark.parametrize(("gun", "tolerance"), [("turn", 2.0), ("gated", 180.0)])
def test_aiming_by_the_observation_alone_beats_walls_standing_still(gun, tolerance):
    """With --gun gated the policy's gun action is 0, so the robot's own mapping follows the lead (as with
    --gun lead), and the policy asks for a shot every turn (a tolerance of 180 degrees): the robot's trigger
    alone must then hold each shot until the gun points at the lead."""
    rounds = 5
    # Seeded, so the 5 rounds start where they did when this bound was set; unseeded, a run could lose 2 of
    # the 5 (one CI run did; 98 of 100 were won over a long battle).
    out = scripted("--opponents", "sample.Walls", "--rounds", str(rounds), "--stand-still", "--gun", gun,
                   "--tolerance", str(tolerance), "--battle-seed", "0")
    (battle,) = out["battles"]
    assert out["gun"] == gun and battle["guns"] == [gun], out  # the mapping the robot itself says it used
    assert battle["rounds"] == rounds
    # 98 of 100 rounds were won in the measured run (turn, docs/robocode.md); a lead off by a turn's travel wins few.
    assert battle["wins"] >= rounds - 1, out
    assert battle["score_share"] > 0.6, out
    # The robot's own count of its shooting. Turn: the policy fires only with the enemy seen and the gun within
    # 2 degrees of the lead. Gated: the trigger fires only within the enemy's half-width (2 degrees at 515 px,
    # more nearer; test_robocode_lead.py checks its bound), and the gun, following the lead while it cools, is
    # then within a degree of it. So the mean aim error is under 2 (one shot at another power's lead aside).
    assert 0 < battle["hits"] <= battle["shots"] and battle["blind_shots"] == 0, out
    assert 0 < battle["aim_error_deg"] < 2.0, out
    assert battle["fire_energy"] == pytest.approx(2.0 * battle["shots"], rel=1e-6), out


@pytest.mark.timeout(180)
@pytest.mark.skipif(MISSING is not None, reason=f"needs Robocode: {MISSING}")
def test_a_battle_seed_repeats_the_battle():
    """--battle-seed sets Robocode's RANDOMSEED: the same seed gives the same rounds shot for shot (the
    scripted robot's own random reversals are seeded by --seed)."""
    args = ("--opponents", "sample.SpinBot", "--rounds", "2", "--battle-seed", "3")
    (first,), (second,) = scripted(*args)["battles"], scripted(*args)["battles"]
    same = ("wins", "shots", "hits", "aim_error_deg", "fire_energy")
    assert first["shots"] > 0 and {k: first[k] for k in same} == {k: second[k] for k in same}, (first, second)


def scripted(*args: str) -> dict:
    p = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(60)
def test_bad_rounds_exit_2_naming_the_flag():
    p = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"], capture_output=True, text=True, timeout=50)
    assert p.returncode == 2
    assert "--rounds 0" in p.stderr
