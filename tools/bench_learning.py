#!/usr/bin/env python3
"""Sample efficiency: eval return against env steps, sacbot (lockstep) beside SB3 SAC.

For each seed, ``sacbot run --pace lockstep`` trains with checkpoints every
``--eval-every`` gradient steps; afterwards every checkpoint's deployable actor is
evaluated deterministically in numpy.  SB3 SAC (MlpPolicy, its defaults; from the
``bench`` extra) is evaluated at the same env-step marks in the same run, when installed.
Last line is JSON.

    python tools/bench_learning.py --env Pendulum-v1 --steps 15000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np


def evaluate_actor(arrays, env_id: str, episodes: int, seed: int) -> float:
    import gymnasium as gym

    import sacbot.envs  # noqa: F401
    from sacbot import policy

    params = policy.build_params(arrays)
    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    rets = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * 100 + ep)
        st, done, ret = policy.initial_state(params), False, 0.0
        while not done:
            a, st = policy.act(params, np.asarray(obs, np.float32).reshape(-1), st)
            obs, r, term, trunc, _ = env.step(low + (a + 1) * (high - low) / 2)
            ret += float(r)
            done = term or trunc
        rets.append(ret)
    return float(np.mean(rets))


def sacbot_curve(a, seed: int) -> list[tuple[int, float]]:
    from sacbot import checkpoint as ck

    d = tempfile.mkdtemp(prefix=f"sacbot-learn-{seed}-")
    cmd = [sys.executable, "-m", "sacbot", "run", "--env", a.env, "--pace", "lockstep", "--steps", str(a.steps),
           "--seed", str(seed), "--init-alpha", str(a.init_alpha), "--save-interval", str(a.eval_every),
           "--keep-last", "1000",
           "--no-save-replay", "--quiet", "--run-dir", os.path.join(d, "run"), "--weights-path", os.path.join(d, "w")]
    subprocess.run(cmd, check=True, capture_output=True)
    curve = []
    for _, path in ck.step_files(os.path.join(d, "w")):
        c = ck.read_checkpoint(path, entries=("actor", "training"))
        arrays = {k[len("export."):]: v for k, v in c["arrays"].items() if k.startswith("export.")}
        curve.append((int(c["meta"]["env_steps"]), evaluate_actor(arrays, a.env, a.episodes, seed)))
    return curve


def sb3_curve(a, seed: int, marks: list[int]) -> list[tuple[int, float]] | None:
    try:
        import gymnasium as gym
        from stable_baselines3 import SAC
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        return None
    import torch

    torch.set_num_threads(1)
    env = gym.make(a.env)
    model = SAC("MlpPolicy", env, seed=seed, verbose=0, learning_starts=1000, device="cpu")
    curve: list[tuple[int, float]] = []

    class Marks(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps in marks:
                eenv = gym.make(a.env)
                rets = []
                for ep in range(a.episodes):
                    obs, _ = eenv.reset(seed=10_000 + seed * 100 + ep)
                    done, ret = False, 0.0
                    while not done:
                        act, _ = model.predict(obs, deterministic=True)
                        obs, r, term, trunc, _ = eenv.step(act)
                        ret += float(r)
                        done = term or trunc
                    rets.append(ret)
                curve.append((self.num_timesteps, float(np.mean(rets))))
            return True

    model.learn(total_timesteps=a.steps, callback=Marks())
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--init-alpha", type=float, default=1.0,
                   help="sacbot's initial temperature; 1.0 as SB3's default (sacbot's own default, 0.02, "
                        "is tuned for TankDuel)")
    p.add_argument("--steps", type=int, default=15000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-every", type=int, default=2000, help="gradient steps between evaluated checkpoints")
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--no-sb3", action="store_true")
    a = p.parse_args()
    out: dict = {"bench": "learning", "env": a.env, "steps": a.steps, "seeds": a.seeds, "sacbot": {}, "sb3": {}}
    for seed in a.seeds:
        curve = sacbot_curve(a, seed)
        out["sacbot"][seed] = curve
        print(f"sacbot seed {seed}: " + ", ".join(f"{s}:{r:.0f}" for s, r in curve), file=sys.stderr, flush=True)
        if not a.no_sb3:
            sb = sb3_curve(a, seed, [s for s, _ in curve])
            if sb is None:
                print("stable-baselines3 not installed (pip install -e '.[bench]'): SB3 skipped", file=sys.stderr)
                a.no_sb3 = True
            else:
                out["sb3"][seed] = sb
                print(f"sb3    seed {seed}: " + ", ".join(f"{s}:{r:.0f}" for s, r in sb), file=sys.stderr,
                      flush=True)
    finals = {k: [c[-1][1] for c in v.values() if c] for k, v in (("sacbot", out["sacbot"]), ("sb3", out["sb3"]))}
    out["median_final_eval_return"] = {k: statistics.median(v) for k, v in finals.items() if v}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
