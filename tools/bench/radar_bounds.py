#!/usr/bin/env python3
"""What memory can buy in the radar duel: scripted policies, read from the observation alone.

A goal in BENCHMARKS.md is a duel where sacbot beats its memoryless control by 30 points.
Before a learner is blamed for a gap it does not show, this measures the gap the duel allows.
Hand-written policies, each a function of what the env gives it (``sacbot/TankDuelRadar-v0``'s
32 values, read by ``decode``), play the same seeded episodes; our tank stands still in all of
them.

With memory (state kept between ticks):

- ``memory``: remembers where the enemy stood at its last sighting, turns the gun at the bearing
  from where it is now, fires power 3 when the gun is within 0.8 target radii.
- ``memory_lead``: also dead-reckons the enemy from that sighting's heading and speed and leads
  the shot by the bullet's flight time, as a player does against a mover.

Memoryless (a function of this tick's observation; the tank's own state is all they keep):

- ``memoryless_blind``: at a sighting it turns the gun by the bearing error it is shown; otherwise
  it holds the gun still.  It fires whenever the gun is cool.  The gun keeps pointing where the
  last sighting put it, so the gun is its memory.
- ``memoryless_seen``: the same aim, but it fires only on ticks the radar shows the gun on target.
- ``memoryless_lead``: leads at a sighting and reads the radar's heading as a clock to fire soon
  after one.
- ``memoryless_heat``: writes the sighting into the gun heat through a cheap shot's power and
  reads it back (see the function).

``--gun-noise SIGMA ...`` adds to each gun turn the Gaussian noise a learner's actor adds in
training (SIGMA is the std before the tanh).
A policy that re-aims from memory every tick shrugs it off; one whose memory is the held gun does
not, so this is what a learner that trains with that noise can see each strategy win.

One JSON line per (policy, opponent, noise); the last line is the summary::

    python tools/bench/radar_bounds.py --episodes 50
    python tools/bench/radar_bounds.py --opponents sitting_duck --gun-noise 0 0.1 0.35 --episodes 20
    python tools/bench/radar_bounds.py --opponents tracker --env-kwargs '{"max_ticks": 300}'
    python tools/bench/radar_bounds.py --env sacbot/TankDuelRadar-v1 --opponents sitting_duck tracker

Any radar arc works (``--env-kwargs '{"radar_arc": 120}'``, or v1's): the clock policies read the
duel's arc.  With ``critic_info`` (v1) the policies see the actor's 32 values only, as a bot would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import NamedTuple

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import sacbot.envs  # noqa: E402,F401 - registers the duels
from sacbot.envs.tank_duel import GUN_RATE, MAX_SPEED, RADAR_HALF_ARC, RADAR_OBS_DIM, RADAR_RATE, RADIUS, H, W, _wrap  # noqa: E402
from tools.bench.tankduel import SEED0  # noqa: E402 - the same episodes as the learners' evals

BULLET_SPEED = 20.0 - 3.0 * 3.0  # power 3, the scripted policies' shot


def gun_action(turn: float) -> float:
    """The a2 that turns the gun by ``turn`` radians this tick (as far as one tick allows)."""
    return max(-1.0, min(1.0, turn / GUN_RATE))


class Seen(NamedTuple):
    """What one radar observation says, in world units (envs/tank_duel.py, ``_radar_obs``)."""

    x: float  # our position
    y: float
    gun: float  # world headings, radians, 0 = north, clockwise
    radar: float
    heat: float  # gun heat (0 = cool)
    tick: int  # ticks since the episode began (from the time-left field)
    seen: bool  # the enemy is in the radar arc this tick; the fields below are 0 when not
    ex: float  # its position
    ey: float
    rel_gun: float  # its bearing relative to the gun
    heading: float
    speed: float
    aim: float  # the gun's bearing error in target radii, clipped to +-1.5


def decode(obs: np.ndarray, max_ticks: int = 600) -> Seen:
    x, y = (obs[0] + 1) * W / 2, (obs[1] + 1) * H / 2
    return Seen(x, y, math.atan2(obs[6], obs[7]), math.atan2(obs[9], obs[10]), float(obs[8]) * 1.6,
                round((1 - obs[31]) / 2 * max_ticks), bool(obs[11] > 0), x + obs[12] * W, y + obs[13] * H,
                math.atan2(obs[15], obs[16]), math.atan2(obs[19], obs[20]), obs[22] * MAX_SPEED, float(obs[21]))


def target_radius(x, y, tx, ty) -> float:
    return math.atan2(RADIUS, max(math.hypot(tx - x, ty - y), RADIUS))


def lead_point(x, y, ex, ey, h, v, age=0):
    """Where a power-3 bullet fired now from (x, y) meets an enemy last seen at (ex, ey), heading h
    at speed v, ``age`` ticks ago, if it kept going straight (kept inside the walls)."""
    tx, ty = ex, ey
    for _ in range(3):
        t = age + math.hypot(tx - x, ty - y) / BULLET_SPEED
        tx = min(max(ex + v * t * math.sin(h), RADIUS), W - RADIUS)
        ty = min(max(ey + v * t * math.cos(h), RADIUS), H - RADIUS)
    return tx, ty


def memory(lead: bool = False):
    """Remembers the last sighting; turns the gun at it from where we are now and fires power 3
    when the gun is within 0.8 target radii.  With ``lead``, dead-reckons the enemy from that
    sighting's heading and speed and leads the shot by the bullet's flight time."""
    last: list = []  # ex, ey, heading, speed, ticks since

    def act(obs: np.ndarray) -> np.ndarray:
        o = decode(obs)
        if o.seen:
            last[:] = [o.ex, o.ey, o.heading, o.speed, 0]
        a = np.array([0.0, 0.0, 0.0, -1.0], np.float32)
        if last:
            ex, ey, h, v, age = last
            last[4] += 1
            tx, ty = lead_point(o.x, o.y, ex, ey, h, v, age) if lead else (ex, ey)
            err = _wrap(math.atan2(tx - o.x, ty - o.y) - o.gun)
            a[2] = gun_action(err)
            if abs(err) < 0.8 * target_radius(o.x, o.y, tx, ty):
                a[3] = 1.0
        return a

    return act, last.clear


def memoryless(fire_blind: bool):
    """This tick only: at a sighting, turn the gun by the error shown; otherwise hold it."""

    def act(obs: np.ndarray) -> np.ndarray:
        o = decode(obs)
        a = np.array([0.0, 0.0, 0.0, 1.0 if fire_blind else -1.0], np.float32)
        if o.seen:
            a[2] = gun_action(o.rel_gun)
            if abs(o.aim) < 0.8:
                a[3] = 1.0
        return a

    return act, lambda: None


def memoryless_lead(half_arc: float = RADAR_HALF_ARC):
    """This tick only: at a sighting it turns the gun to the lead point, and it fires only while
    the radar is 5 degrees short of to 55 past the arc's edge beyond the gun (15-75 degrees at the
    default 40-degree arc), which happens one or two ticks after the radar swept the enemy (the
    radar turns at a fixed rate, so its heading is a clock)."""
    lo, hi = half_arc - math.radians(5), half_arc + math.radians(55)

    def act(obs: np.ndarray) -> np.ndarray:
        o = decode(obs)
        a = np.zeros(4, np.float32)
        if o.seen:
            tx, ty = lead_point(o.x, o.y, o.ex, o.ey, o.heading, o.speed)
            a[2] = gun_action(_wrap(math.atan2(tx - o.x, ty - o.y) - o.gun))
        a[3] = 1.0 if lo <= _wrap(o.radar - o.gun) <= hi else -1.0
        return a

    return act, lambda: None


CLOCK_MIN, CLOCK_MAX = 0.1, 0.5  # powers of the shots that write the register


def memoryless_heat(max_ticks: int = 600, half_arc: float = RADAR_HALF_ARC):
    """This tick only, but it writes its memory into the tank: at a sighting with the gun off
    target it fires a cheap shot whose power encodes where the enemy is relative to the radar.
    The gun heat then says that power (its part below one cooling step, 0.1 a tick) and how many
    ticks ago it fired (the rest); with the radar's fixed rate that gives the enemy's bearing, and
    the gun keeps turning onto it between sightings.  It shows that a memoryless policy can carry
    memory through the game's own state."""
    span = CLOCK_MAX - CLOCK_MIN

    def act(obs: np.ndarray) -> np.ndarray:
        o = decode(obs, max_ticks)
        a = np.array([0.0, 0.0, 0.0, -1.0], np.float32)
        if o.seen:
            a[2] = gun_action(o.rel_gun)
            if o.heat == 0.0:
                if abs(o.aim) < 0.8:
                    a[3] = 1.0  # on target: the real shot
                else:  # write the bearing's offset from the radar (within its half arc) into the power
                    offset = _wrap(o.gun + o.rel_gun - o.radar)
                    power = CLOCK_MIN + span * min(max((offset + half_arc) / (2 * half_arc), 0.0), 0.999)
                    a[3] = (power - 0.1) / 2.9
            return a
        if o.heat > 0.0:  # heat = 1 + power / 5 - 0.1 * ticks since the shot
            ticks = round(10.6 - 10 * o.heat)
            two_power = o.heat * 10 - 10 + ticks
            if 2 * CLOCK_MIN - 1e-3 <= two_power < 2 * CLOCK_MAX and 1 <= ticks <= 11:
                offset = ((two_power / 2 - CLOCK_MIN) / span) * 2 * half_arc - half_arc
                bearing = o.radar - RADAR_RATE * ticks + offset
                a[2] = gun_action(_wrap(bearing - o.gun))
            return a
        if o.tick > 12:  # cool, unseen, past the first radar turn: the gun is on the last sighting
            a[3] = 1.0
        return a

    return act, lambda: None


POLICIES = {  # name -> (the unwrapped duel -> (act, reset)); the clock policies read its arc
    "memory": lambda _: memory(),
    "memory_lead": lambda _: memory(lead=True),
    "memoryless_blind": lambda _: memoryless(True),
    "memoryless_seen": lambda _: memoryless(False),
    "memoryless_lead": lambda duel: memoryless_lead(duel.radar_half_arc),
    "memoryless_heat": lambda duel: memoryless_heat(duel.max_ticks, duel.radar_half_arc),
}


def actor_view(policy, n: int = RADAR_OBS_DIM):
    """``policy`` fed the actor's part of the observation: a duel with ``critic_info`` (v1) appends
    values for the critic alone, which a deployed bot never sees."""
    act, reset = policy
    return (lambda obs: act(obs[:n])), reset


def with_gun_noise(policy, sigma: float, seed: int = 0):
    """``policy`` with N(0, sigma) added to its gun turn before a tanh, as a SAC actor samples
    (a = tanh(u), u ~ N(mean, std)); sigma 0 returns it unchanged."""
    if sigma == 0:
        return policy
    act, reset = policy
    rng = np.random.default_rng(seed)

    def noisy(obs: np.ndarray) -> np.ndarray:
        a = np.array(act(obs), np.float32)  # a copy: a policy may hand out its own array
        a[2] = math.tanh(math.atanh(min(max(float(a[2]), -0.999999), 0.999999)) + sigma * rng.standard_normal())
        return a

    return noisy, reset


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
    p.add_argument("--gun-noise", type=float, nargs="+", default=[0.0], metavar="SIGMA",
                   help="std of Gaussian noise added to the gun turn before the tanh, as in training (default 0)")
    a = p.parse_args()
    if not all(math.isfinite(g) and g >= 0 for g in a.gun_noise):
        p.error(f"--gun-noise wants finite stds >= 0, got {a.gun_noise}")
    try:
        kwargs = json.loads(a.env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        p.error(f"--env-kwargs {a.env_kwargs!r}: expected a JSON object ({e})")
    if a.episodes < 1:
        p.error(f"--episodes must be at least 1, got {a.episodes}")
    if "opponents" in kwargs:  # each opponent's episodes set it; the kwarg would be ignored, yet echoed
        p.error("--env-kwargs: give the opponents with --opponents")
    if "render_mode" in kwargs:  # the bounds play without drawing; "human" failed deep in gymnasium
        p.error("--env-kwargs: render_mode is not for a bench (sacbot render draws an episode)")
    out: dict = {"bench": "radar_bounds", "env": a.env, "env_kwargs": kwargs, "results": {}}
    for opp in a.opponents:
        try:
            env = gym.make(a.env, **{**kwargs, "opponents": [opp]})
        except (gym.error.Error, TypeError, ValueError) as e:
            p.error(f"cannot make {a.env} against {opp!r} with {kwargs}: {e}")
        duel = env.unwrapped
        if getattr(duel, "observation", None) != "radar" \
                or env.observation_space.shape != (RADAR_OBS_DIM + duel.critic_obs,):
            p.error(f"{a.env} does not give the radar observation ({RADAR_OBS_DIM} values for the actor): "
                    f"{env.observation_space}")
        if duel.gun_control != "turn":
            p.error(f"the scripted policies turn the gun directly; {a.env} has gun_control {duel.gun_control!r}")
        for name, make in POLICIES.items():
            for sigma in a.gun_noise:
                r = play(env, actor_view(with_gun_noise(make(duel), sigma)), a.episodes)
                r.update(policy=name, opponent=opp, gun_noise=sigma)
                print(json.dumps(r), flush=True)
                out["results"][f"{name}/{opp}" + (f"/noise{sigma:g}" if len(a.gun_noise) > 1 or sigma else "")] = r
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
