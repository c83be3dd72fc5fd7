"""The Robocode robot's lead (``SacbotRobot.leadBearing``, clients/robocode/): the gun's angles in the
observation point at where a bullet meets the enemy.  Checked against the continuous-time
intercept worked out here, independently of the robot's turn-by-turn loop.  Compiled with javac
against Robocode's jar; skipped where Robocode or a JDK is missing (./tools/setup.sh robocode)."""

from __future__ import annotations

import math
import os
import subprocess

import pytest

from sacbot.robocode.install import ROBOT_SOURCES, RobocodeMissing, find_install

# Calls the robot's pure function once per case (11 numbers each) and prints one bearing a line.
CHECK = """package sacbot;

public final class LeadCheck {
    public static void main(String[] a) {
        for (int i = 0; i + 11 <= a.length; i += 11) {
            double[] v = new double[11];
            for (int j = 0; j < 11; j++) {
                v[j] = Double.parseDouble(a[i + j]);
            }
            System.out.println(SacbotRobot.leadBearing(v[0], v[1], v[2], v[3], v[4], v[5], v[6], (long) v[7], v[8],
                    v[9], v[10]));
        }
    }
}
"""


# The trigger of --gun gated (``SacbotRobot.onTarget``): one line per (angle off the lead, distance) pair.
GATE = """package sacbot;

public final class GateCheck {
    public static void main(String[] a) {
        for (int i = 0; i + 2 <= a.length; i += 2) {
            System.out.println(SacbotRobot.onTarget(Double.parseDouble(a[i]), Double.parseDouble(a[i + 1])));
        }
    }
}
"""


def _install():
    try:
        return find_install()
    except RobocodeMissing as e:
        pytest.skip(f"the lead's test needs Robocode and a JDK: {e}")


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    """Runs one of the check classes above, compiled with the robot, on some numbers: its output lines."""
    inst = _install()
    tmp = tmp_path_factory.mktemp("lead")
    sources = []
    for name, code in (("LeadCheck", CHECK), ("GateCheck", GATE)):
        sources.append(tmp / f"{name}.java")
        sources[-1].write_text(code, encoding="utf-8")
    cp = f"{inst.jar}{os.pathsep}{inst.msgpack_jar}"
    done = subprocess.run([inst.javac, "-Xlint:all", "-Werror", "-cp", cp, "-d", str(tmp / "classes"),
                           *ROBOT_SOURCES, *map(str, sources)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def run(cls: str, numbers: list[float]) -> list[str]:
        out = subprocess.run([inst.java, "-cp", f"{tmp / 'classes'}{os.pathsep}{cp}", f"sacbot.{cls}",
                              *("NaN" if math.isnan(v) else repr(float(v)) for v in numbers)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    return run


@pytest.fixture(scope="module")
def lead(java):
    def run(*cases: tuple[float, ...]) -> list[float]:
        return [float(line) for line in java("LeadCheck", [v for case in cases for v in case])]

    return run


def bearing(x: float, y: float, tx: float, ty: float) -> float:
    return math.atan2(tx - x, ty - y)  # Robocode's angles: 0 north, clockwise


def degrees_apart(a: float, b: float) -> float:
    return abs(math.degrees(math.remainder(a - b, math.tau)))


def intercept(x, y, ex, ey, heading, v, turn, age, speed) -> tuple[float, float]:
    """Where a bullet fired now from (x, y) at ``speed`` meets an enemy seen ``age`` turns ago at
    (ex, ey), moving at v along ``heading`` and turning ``turn`` radians a turn (continuous time, no
    walls): the first t at which the bullet has flown as far as the enemy is away."""

    def at(t: float) -> tuple[float, float]:
        s = age + t
        if abs(turn) < 1e-12:
            return ex + v * s * math.sin(heading), ey + v * s * math.cos(heading)
        r = v / turn
        return (ex + r * (math.cos(heading) - math.cos(heading + turn * s)),
                ey + r * (math.sin(heading + turn * s) - math.sin(heading)))

    t = 0.0
    while math.dist((x, y), at(t)) > speed * t:
        t += 1e-3
        assert t < 500, "no intercept"
    return at(t)


FIELD = (1e6, 1e6)  # far walls: the cases below never reach them


@pytest.mark.timeout(180)
def test_a_robot_that_stands_still_is_aimed_at_where_it_was_seen(lead):
    got = lead((400.0, 100.0, 400.0, 500.0, 1.0, 0.0, 0.0, 0, 11.0, *FIELD),
               (100.0, 100.0, 700.0, 400.0, 2.0, 0.0, 0.1, 30, 17.0, *FIELD))
    assert got[0] == pytest.approx(bearing(400, 100, 400, 500), abs=1e-12)
    assert got[1] == pytest.approx(bearing(100, 100, 700, 400), abs=1e-12)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("age", [0, 12])
def test_a_robot_on_a_straight_line_is_led_to_where_the_bullet_meets_it(lead, age):
    me, enemy, heading, v, speed = (400.0, 100.0), (300.0, 500.0), math.pi / 2, 8.0, 11.0
    got = lead((*me, *enemy, heading, v, 0.0, age, speed, *FIELD))[0]
    want = bearing(*me, *intercept(*me, *enemy, heading, v, 0.0, age, speed))
    seen = bearing(*me, *enemy)
    # The robot steps a whole turn at a time: within one turn's travel (8 px at ~450 px) of the exact intercept.
    assert degrees_apart(got, want) < 1.5
    assert degrees_apart(got, seen) > 20  # and far from aiming where the enemy was seen


@pytest.mark.timeout(180)
def test_a_turning_robot_is_led_along_its_circle(lead):
    me, enemy, heading, v, turn, speed = (400.0, 100.0), (400.0, 450.0), math.pi / 2, 8.0, math.radians(-4), 11.0
    got = lead((*me, *enemy, heading, v, turn, 0, speed, *FIELD))[0]
    want = bearing(*me, *intercept(*me, *enemy, heading, v, turn, 0, speed))
    straight = bearing(*me, *intercept(*me, *enemy, heading, v, 0.0, 0, speed))
    assert degrees_apart(want, straight) > 10  # the case tells the circle from the line
    assert degrees_apart(got, want) < 2.0


@pytest.mark.timeout(180)
def test_the_lead_stops_at_the_wall(lead):
    # Running east along y = 300 toward the east wall of an 800 x 600 field: the robot's centre stops 18 px short.
    got = lead((100.0, 100.0, 760.0, 300.0, math.pi / 2, 8.0, 0.0, 0, 11.0, 800.0, 600.0))[0]
    assert got == pytest.approx(bearing(100, 100, 782, 300), abs=1e-12)


@pytest.mark.timeout(180)
def test_the_gated_trigger_opens_within_the_angle_the_enemys_half_width_spans(java):
    """--gun gated fires only while the gun is within atan(18 / distance) of the lead: 2.58 degrees at 400 px,
    19.8 at 50 px, and the robot's own half-width (45 degrees) closer than that; either side of the lead alike."""
    cases = [(1.0, 400.0, True), (-1.0, 400.0, True), (2.5, 400.0, True), (2.7, 400.0, False), (-2.7, 400.0, False),
             (10.0, 50.0, True), (21.0, 50.0, False), (44.0, 5.0, True), (46.0, 5.0, False), (0.0, 1000.0, True),
             (1.1, 1000.0, False)]
    got = java("GateCheck", [v for off, dist, _ in cases for v in (math.radians(off), dist)])
    assert got == [str(want).lower() for _, _, want in cases], list(zip(cases, got))
    assert java("GateCheck", [math.nan, 400.0]) == ["false"]  # a lead not known yet never fires
