#!/usr/bin/env python3
"""TankDuel learning curves: win rate against env steps, from a run's step checkpoints.

Train first, keeping every step checkpoint, e.g. against spinner::

    sacbot run --env sacbot/TankDuel-v0 --env-kwargs '{"opponents": ["spinner"]}' \\
        --pace lockstep --steps 40000 --keep-last 100 --weights-path /tmp/td/spinner/w

then evaluate each ``sac_step_<N>.zip`` of one or more runs, deterministically (eval mode: the
tanh of the mean, in numpy), on the same episode seeds, with a uniform-random policy as contrast::

    python tools/bench_tankduel.py --runs lstm=/tmp/td/spinner/w --episodes 20 --random spinner

The env, its kwargs and ``memoryless`` come from each checkpoint's manifest, so a run is
evaluated in the duel it trained on.  One JSON line per point; the last line is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sacbot.envs  # noqa: E402,F401 - registers TankDuel
from sacbot import checkpoint as ck  # noqa: E402
from sacbot import policy  # noqa: E402

SEED0 = 10_000  # eval episodes use seeds SEED0 + k, apart from training's 0, 1, 2, ...


def play(env: gym.Env, act, episodes: int) -> dict:
    wins, rets = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=SEED0 + k)
        state, done, ret = None, False, 0.0
        while not done:
            a, state = act(obs, state)
            obs, r, term, trunc, info = env.step(a)
            ret += float(r)
            done = term or trunc
        wins.append(bool(info["won"]))
        rets.append(ret)
    return {"win_rate": float(np.mean(wins)), "mean_return": round(float(np.mean(rets)), 3), "episodes": episodes}


def actor_fn(path: str):
    params = policy.build_params(ck.load_actor(path))
    cfg = ck.read_checkpoint(path, entries=("actor",))["manifest"]["config"]

    def act(obs, state):
        if state is None or cfg.get("memoryless"):
            state = policy.initial_state(params)
        return policy.act(params, np.asarray(obs, np.float32), state, None)

    return act, cfg


def random_fn(seed: int):
    rng = np.random.default_rng(seed)
    return lambda obs, state: (rng.uniform(-1, 1, 4).astype(np.float32), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="*", default=[], metavar="NAME=WEIGHTS_DIR",
                   help="runs to evaluate: every sac_step_<N>.zip in each weights dir")
    p.add_argument("--random", nargs="*", default=[], metavar="OPPONENT",
                   help="also evaluate a uniform-random policy against these opponents")
    p.add_argument("--episodes", type=int, default=20)
    a = p.parse_args()
    out: dict = {"bench": "tankduel", "episodes": a.episodes, "curves": {}, "random": {}}
    for spec in a.runs:
        name, sep, wdir = spec.partition("=")
        if not sep or not os.path.isdir(wdir):
            p.error(f"--runs wants NAME=WEIGHTS_DIR with an existing directory, got {spec!r}")
        steps = ck.step_files(wdir)
        if not steps:
            p.error(f"{wdir}: no sac_step_<N>.zip files (train with --keep-last large enough)")
        curve = []
        for _, path in steps:
            act, cfg = actor_fn(path)
            env = gym.make(cfg["env"], **json.loads(cfg.get("env_kwargs") or "{}"))
            r = play(env, act, a.episodes)
            man = ck.read_checkpoint(path, entries=("actor",))["manifest"]
            r.update(run=name, env_steps=int(man["env_steps"]), grad_steps=int(man["step"]),
                     env_kwargs=cfg.get("env_kwargs"), memoryless=bool(cfg.get("memoryless")))
            print(json.dumps(r), flush=True)
            curve.append(r)
        out["curves"][name] = curve
    for opp in a.random:
        env = gym.make("sacbot/TankDuel-v0", opponents=[opp])
        r = play(env, random_fn(0), a.episodes)
        r.update(run="random", opponent=opp)
        print(json.dumps(r), flush=True)
        out["random"][opp] = r
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
