"""The duel's bodies and rules: the arena, tanks, bullets, and the scripted opponents.

Used by :mod:`sacbot.envs.tank_duel` (the env), which re-exports these names.
"""

from __future__ import annotations

import math

W, H = 800.0, 600.0
RADIUS = 18.0
MAX_SPEED = 8.0
RADAR_RATE = math.radians(30.0)
RADAR_ARC_DEG = 40.0  # the default radar_arc
RADAR_HALF_ARC = math.radians(RADAR_ARC_DEG / 2)
GUN_RATE = math.radians(20.0)
AIM_OFFSET = math.radians(30.0)
OBS_DIM = 37
RADAR_OBS_DIM = 32
CRITIC_OBS_DIM = 14  # critic_info: the radar's 13 enemy values as if in the arc, and bullets on course


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


class Tank:
    __slots__ = ("x", "y", "heading", "v", "gun", "radar", "energy", "heat")

    def __init__(self, x, y, heading, gun):
        self.x, self.y, self.heading, self.v = x, y, heading, 0.0
        self.gun, self.radar, self.energy, self.heat = gun, gun, 100.0, 0.0

    def drive(self, target_speed: float, turn: float) -> None:
        target = max(-MAX_SPEED, min(MAX_SPEED, target_speed))
        if abs(target) > abs(self.v) and target * self.v >= 0:
            self.v += max(-1.0, min(1.0, target - self.v))  # accelerate 1/tick
        else:
            self.v += max(-2.0, min(2.0, target - self.v))  # brake 2/tick
        max_turn = math.radians(10.0 - 0.75 * abs(self.v))
        self.heading = _wrap(self.heading + max(-max_turn, min(max_turn, turn)))
        self.x += self.v * math.sin(self.heading)
        self.y += self.v * math.cos(self.heading)


class Bullet:
    __slots__ = ("x", "y", "dx", "dy", "power", "owner")

    def __init__(self, x, y, heading, power, owner):
        speed = 20.0 - 3.0 * power
        self.x, self.y = x, y
        self.dx, self.dy = speed * math.sin(heading), speed * math.cos(heading)
        self.power, self.owner = power, owner


def bullet_damage(power: float) -> float:
    return 4.0 * power + 2.0 * max(power - 1.0, 0.0)


def _bearing(src: Tank, x: float, y: float) -> float:
    return math.atan2(x - src.x, y - src.y)  # 0 = +y (north), clockwise positive


# --- scripted opponents: (env, me, enemy) -> (target_speed, turn, gun_turn, fire_power) --
def sitting_duck(env, me, enemy):
    return 0.0, 0.0, 0.0, 0.0


def spinner(env, me, enemy):
    """Circles and fires: constant speed and turn, gun spinning, fires power 1 when cool."""
    return 5.0, math.radians(6.0), math.radians(12.0), 1.0


def walker(env, me, enemy):
    """Runs along the walls, gun pointing into the arena; fires when we are in front."""
    margin = 60.0
    # heading of the wall segment we are on, walking counter-clockwise round the arena
    if me.y <= margin and me.x < W - margin:
        want = math.pi / 2  # along the bottom, east
    elif me.x >= W - margin and me.y < H - margin:
        want = 0.0  # up the right wall, north
    elif me.y >= H - margin and me.x > margin:
        want = -math.pi / 2  # along the top, west
    elif me.x <= margin and me.y > margin:
        want = math.pi  # down the left wall, south
    else:  # not at a wall yet: head for the nearest one
        d = [(me.x, -math.pi / 2), (W - me.x, math.pi / 2), (me.y, math.pi), (H - me.y, 0.0)]
        want = min(d)[1]
    turn = _wrap(want - me.heading)
    gun_target = _wrap(want - math.pi / 2)  # 90 degrees left of travel: into the arena
    gun_turn = _wrap(gun_target - me.gun)
    aim = _wrap(_bearing(me, enemy.x, enemy.y) - me.gun)
    return 7.0, turn, gun_turn, 2.0 if abs(aim) < math.radians(10) else 0.0


def tracker(env, me, enemy):
    """Turns to face us and chases to 150 units; fires when its gun is on target."""
    b = _bearing(me, enemy.x, enemy.y)
    dist = math.hypot(enemy.x - me.x, enemy.y - me.y)
    speed = 6.0 if dist > 150.0 else 0.0
    aim = _wrap(b - me.gun)
    return speed, _wrap(b - me.heading), aim, 1.5 if abs(aim) < math.radians(5) else 0.0


OPPONENTS = {"sitting_duck": sitting_duck, "spinner": spinner, "walker": walker, "tracker": tracker}


def _segment_hits(x0, y0, x1, y1, cx, cy, r) -> bool:
    """Does the segment (x0,y0)-(x1,y1) pass within r of (cx, cy)?"""
    sx, sy = x1 - x0, y1 - y0
    L2 = sx * sx + sy * sy
    t = 0.0 if L2 == 0 else max(0.0, min(1.0, ((cx - x0) * sx + (cy - y0) * sy) / L2))
    px, py = x0 + t * sx - cx, y0 + t * sy - cy
    return px * px + py * py <= r * r


def separate(a: Tank, b: Tank) -> None:
    """Push two overlapping tanks apart along the line between them, and stop both."""
    d = math.hypot(a.x - b.x, a.y - b.y) or 1e-6
    push = (2 * RADIUS - d) / 2 + 1e-3
    ux, uy = (a.x - b.x) / d, (a.y - b.y) / d
    a.x, a.y, b.x, b.y = a.x + ux * push, a.y + uy * push, b.x - ux * push, b.y - uy * push
    a.v = b.v = 0.0
