#!/usr/bin/env python3
"""What memory can buy in the radar duel: scripted policies, read from the observation alone.

Issue 15 asks for a duel where sacbot beats its memoryless control by 30 points.  Before a
learner is blamed for a gap it does not show, this measures the gap the duel allows: five
hand-written policies, each a function of what the env gives it (``sacbot/TankDuelRadar-v0``'s
32 values), play the same seeded episodes.

- ``memory``: remembers where the enemy stood at its last sighting (own position + the offset
  the radar gave), turns the gun at the bearing from where it is now, fires power 3 when the
  gun is within 0.8 target radii.  Perfect memory, no learning.
- ``memory_lead``: also remembers the enemy's heading and speed at that sighting, dead-reckons it
  and leads the shot by the bullet's flight time, as a player does against a mover.
- ``memoryless_blind``: this tick only.  When the radar sees the enemy it turns the gun by the
  bearing error it is shown; otherwise it holds the gun still.  It fires whenever the gun is
  cool.  The gun itself is its memory: it keeps pointing where the last sighting put it.
- ``memoryless_seen``: the same aim, but it fires only on ticks the radar shows the gun on target.
- ``memoryless_lead``: leads at a sighting and uses the radar's heading as a clock to fire soon
  after one (see the function).

All of them stand still (sitting_duck does not shoot; tracker comes to them).  One JSON line per
(policy, opponent); the last line is the summary::

    python tools/bench_radar_bounds.py --episodes 50
    python tools/bench_radar_bounds.py --env-kwargs '{"max_ticks": 200}'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sacbot.envs  # noqa: E402,F401 - registers the duels
from sacbot.envs.tank_duel import GUN_RATE, MAX_SPEED, RADIUS, H, W  # noqa: E402

BULLET_SPEED = 20.0 - 3.0 * 3.0  # power 3, the scripted policies' shot

SEED0 = 10_000  # the episode seeds bench_tankduel evaluates on


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


def gun_action(turn: float) -> float:
    """The a2 that turns the gun by ``turn`` radians this tick (as far as one tick allows)."""
    return max(-1.0, min(1.0, turn / GUN_RATE))


def memory():
    seen_at: list = []  # the enemy's world position at the last sighting

    def act(obs: np.ndarray) -> np.ndarray:
        x, y = (obs[0] + 1) * W / 2, (obs[1] + 1) * H / 2
        gun = math.atan2(obs[6], obs[7])
        if obs[11] > 0:
            seen_at[:] = [x + obs[12] * W, y + obs[13] * H]
        a = np.zeros(4, np.float32)
        a[3] = -1.0
        if seen_at:
            ex, ey = seen_at
            err = _wrap(math.atan2(ex - x, ey - y) - gun)
            a[2] = gun_action(err)
            if abs(err) < 0.8 * math.atan2(RADIUS, max(math.hypot(ex - x, ey - y), RADIUS)):
                a[3] = 1.0
        return a

    return act, seen_at.clear


def memory_lead():
    """Remembers the last sighting's position, heading and speed, dead-reckons the enemy from it
    and leads the shot by the bullet's flight time (power 3 flies 11 units a tick)."""
    seen: list = []  # x, y, heading, speed at the sighting, ticks since

    def act(obs: np.ndarray) -> np.ndarray:
        x, y = (obs[0] + 1) * W / 2, (obs[1] + 1) * H / 2
        gun = math.atan2(obs[6], obs[7])
        if obs[11] > 0:
            seen[:] = [x + obs[12] * W, y + obs[13] * H, math.atan2(obs[19], obs[20]), obs[22] * MAX_SPEED, 0]
        a = np.zeros(4, np.float32)
        a[3] = -1.0
        if seen:
            ex, ey, h, v, age = seen
            seen[4] += 1
            tx, ty = lead_point(x, y, ex, ey, h, v, age)
            err = _wrap(math.atan2(tx - x, ty - y) - gun)
            a[2] = gun_action(err)
            if abs(err) < 0.8 * math.atan2(RADIUS, max(math.hypot(tx - x, ty - y), RADIUS)):
                a[3] = 1.0
        return a

    return act, seen.clear


def lead_point(x, y, ex, ey, h, v, age=0):
    """Where a power-3 bullet fired now from (x, y) meets an enemy last seen at (ex, ey), heading h
    at speed v, ``age`` ticks ago, if it kept going straight (kept inside the walls)."""
    tx, ty = ex, ey
    for _ in range(3):
        t = age + math.hypot(tx - x, ty - y) / BULLET_SPEED
        tx = min(max(ex + v * t * math.sin(h), RADIUS), W - RADIUS)
        ty = min(max(ey + v * t * math.cos(h), RADIUS), H - RADIUS)
    return tx, ty


def memoryless_lead():
    """This tick only, but clever: at a sighting it turns the gun to the lead
    point, and it fires only while the radar is 15-75 degrees past the gun, which happens one or
    two ticks after the radar swept the enemy (the radar's heading is a clock)."""

    def act(obs: np.ndarray) -> np.ndarray:
        a = np.zeros(4, np.float32)
        x, y = (obs[0] + 1) * W / 2, (obs[1] + 1) * H / 2
        gun, radar = math.atan2(obs[6], obs[7]), math.atan2(obs[9], obs[10])
        if obs[11] > 0:
            tx, ty = lead_point(x, y, x + obs[12] * W, y + obs[13] * H, math.atan2(obs[19], obs[20]),
                                obs[22] * MAX_SPEED)
            a[2] = gun_action(_wrap(math.atan2(tx - x, ty - y) - gun))
        a[3] = 1.0 if math.radians(15) <= _wrap(radar - gun) <= math.radians(75) else -1.0
        return a

    return act, lambda: None


def memoryless(fire_blind: bool):
    def act(obs: np.ndarray) -> np.ndarray:
        a = np.zeros(4, np.float32)
        a[3] = 1.0 if fire_blind else -1.0
        if obs[11] > 0:
            a[2] = gun_action(math.atan2(obs[15], obs[16]))
            if abs(obs[21]) < 0.8:  # the gun's error in target radii, as the radar shows it
                a[3] = 1.0
        return a

    return act, lambda: None


def play(env: gym.Env, policy, episodes: int) -> dict:
    act, reset = policy
    wins, ticks = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=SEED0 + k)
        reset()
        done, t = False, 0
        while not done:
            obs, _, term, trunc, info = env.step(act(obs))
            done, t = term or trunc, t + 1
        wins.append(bool(info["won"]))
        ticks.append(t)
    won_ticks = [t for t, w in zip(ticks, wins) if w]
    return {"win_rate": float(np.mean(wins)), "episodes": episodes,
            "median_ticks_to_win": float(np.median(won_ticks)) if won_ticks else None,
            "won_within_200_ticks": float(np.mean([w and t <= 200 for t, w in zip(ticks, wins)]))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="sacbot/TankDuelRadar-v0", help="a duel with the radar observation")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of extra env kwargs")
    p.add_argument("--opponents", nargs="+", default=["sitting_duck", "tracker", "walker", "spinner"])
    p.add_argument("--episodes", type=int, default=50)
    a = p.parse_args()
    try:
        kwargs = json.loads(a.env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        p.error(f"--env-kwargs {a.env_kwargs!r}: expected a JSON object ({e})")
    if a.episodes < 1:
        p.error(f"--episodes must be at least 1, got {a.episodes}")
    out: dict = {"bench": "radar_bounds", "env": a.env, "env_kwargs": kwargs, "results": {}}
    for opp in a.opponents:
        env = gym.make(a.env, **{**kwargs, "opponents": [opp]})
        if env.observation_space.shape != (32,):
            p.error(f"{a.env} does not give the radar observation (32 values): {env.observation_space}")
        if env.unwrapped.gun_control != "turn":
            p.error(f"the scripted policies turn the gun directly; {a.env} has gun_control "
                    f"{env.unwrapped.gun_control!r}")
        for name, pol in (("memory", memory()), ("memory_lead", memory_lead()), ("memoryless_blind", memoryless(True)),
                          ("memoryless_lead", memoryless_lead()),
                          ("memoryless_seen", memoryless(False))):
            r = play(env, pol, a.episodes)
            r.update(policy=name, opponent=opp)
            print(json.dumps(r), flush=True)
            out["results"][f"{name}/{opp}"] = r
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
