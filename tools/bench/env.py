#!/usr/bin/env python3
"""TankDuel env steps/s, single-threaded, no rendering, random actions; median of rounds.

Measured on the raw env and through gym.make (with gymnasium's checker/order wrappers), beside
Pendulum-v1 as a reference in the same run.  Last line is JSON.

    python tools/bench/env.py --steps 50000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym
import numpy as np

import sacbot.envs  # noqa: F401


def rate(env, steps: int, seed: int) -> float:
    env.reset(seed=seed)
    acts = np.random.default_rng(seed).uniform(-1, 1, (steps,) + env.action_space.shape).astype(np.float32)
    t0 = time.perf_counter()
    for a in acts:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    from sacbot.envs.tank_duel import TankDuel

    res: dict[str, list[float]] = {"tankduel_raw": [], "tankduel_gym_make": [], "pendulum_gym_make": []}
    for r in range(a.rounds):
        res["tankduel_raw"].append(rate(TankDuel(opponents=("tracker",)), a.steps, r))
        res["tankduel_gym_make"].append(rate(gym.make("sacbot/TankDuel-v0", opponents=("tracker",)), a.steps, r))
        res["pendulum_gym_make"].append(rate(gym.make("Pendulum-v1"), a.steps, r))
    med = {k: round(statistics.median(v)) for k, v in res.items()}
    print(json.dumps({"bench": "env", "steps_per_round": a.steps, "rounds": a.rounds, "median_steps_per_s": med,
                      "ratio_tankduel_vs_pendulum": round(med["tankduel_gym_make"] / med["pendulum_gym_make"], 2),
                      "runs": {k: [round(x) for x in v] for k, v in res.items()}}))


if __name__ == "__main__":
    main()
