#!/usr/bin/env python3
"""Sample efficiency where memory matters: eval return against env steps on the POMDP
Pendulums, sacbot beside its memoryless control and SB3 SAC-MLP, in one run.

Variants (``--variants``):

- ``sacbot``: ``sacbot run --pace lockstep`` with its defaults (and the env's preset);
- ``memoryless``: the same with ``--memoryless`` (recurrent state reset every tick);
- ``sb3``: SB3 SAC, MlpPolicy, its defaults and learning_starts 1000 (the ``bench`` extra).

sacbot's runs save a checkpoint every ``--eval-every`` gradient steps; afterwards each one's
deployable (int8) actor is evaluated deterministically in numpy on the same episode seeds.  SB3
is evaluated at the same env-step marks.  ``--int8-vs-fp32`` also evaluates each final
checkpoint's fp32 actor (the QAT actor's float weights, clipped to its quantizers' ranges and not
rounded; and bare, as fp32_noclip) on those seeds.

The anchor is pomdp-baselines (Ni et al. 2022), configs/pomdp/pendulum/v/rnn.yml: separate
LSTM actor and critic, whole-episode sequences (sampled_seq_len -1: 200 steps), batch 32
episodes, hidden 128, gamma 0.9, lr 3e-4, tau 0.005, alpha learned from 0.2, UTD 1, 5 random
episodes before training.  ``--sacbot-args`` passes extra flags to both sacbot variants, e.g.
``--sacbot-args='--gamma 0.9 --seq-len 64'`` to try those settings.

    python tools/bench/learning.py --steps 25000 --seeds 0 1 2
    python tools/bench/learning.py --envs Pendulum-v1 --steps 10000 --variants sacbot sb3

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import numpy as np

EVAL_SEED0 = 10_000  # eval episodes: seeds EVAL_SEED0 + 100 * seed + k, apart from training's


# --- evaluation of an exported actor --------------------------------------------------------
def with_reward_input(env):
    """``env`` whose observation ends with the previous reward (0 after a reset): the input an
    Agent with ``reward_input`` gives its actor (sacbot/acting/agent.py, ``_with_reward``)."""
    import gymnasium as gym

    class PrevRewardObs(gym.Wrapper):
        def __init__(self, inner):
            super().__init__(inner)
            box = inner.observation_space
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(box.shape)) + 1,), np.float32)

        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            return np.append(np.asarray(obs, np.float32).reshape(-1), np.float32(0.0)), info

        def step(self, action):
            obs, r, term, trunc, info = self.env.step(action)
            return np.append(np.asarray(obs, np.float32).reshape(-1), np.float32(r)), r, term, trunc, info

    return PrevRewardObs(env)


def checkpoint_config(path: str) -> dict:
    from sacbot.store import checkpoint as ck
    return ck.read_checkpoint(path, entries=("actor",))["manifest"]["config"]


def evaluate_actor(arrays, env_id: str, episodes: int, seed: int, memoryless: bool = False,
                   reward_input: bool = False) -> float:
    """Mean return of the deterministic numpy actor; a memoryless actor starts every tick fresh,
    as it acted in training; with ``reward_input`` it sees the previous reward, as it did."""
    import gymnasium as gym

    import sacbot.envs  # noqa: F401 - registers the sacbot/* ids
    from sacbot.acting import policy
    params = policy.build_params(arrays)
    env = gym.make(env_id)
    if reward_input:
        env = with_reward_input(env)
    low, high = env.action_space.low, env.action_space.high
    rets = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED0 + seed * 100 + ep)
        st, done, ret = policy.initial_state(params), False, 0.0
        while not done:
            if memoryless:
                st = policy.initial_state(params)
            a, st = policy.act(params, np.asarray(obs, np.float32).reshape(-1), st)
            obs, r, term, trunc, _ = env.step(low + (a + 1) * (high - low) / 2)
            ret += float(r)
            done = term or trunc
        rets.append(ret)
    return float(np.mean(rets))


def int8_actor(path: str) -> dict[str, np.ndarray]:
    """The checkpoint's deployable actor, as acting runs it."""
    from sacbot.store import checkpoint as ck
    return ck.load_actor(path)


# The QAT actor's float parameters under the export's names (sacbot/learning/sac.py, _weights/_biases).
_FP32_NAMES = {"fc1.w": "fc1.weight", "fc1.b": "fc1.bias", "fc2.w": "fc2.weight", "fc2.b": "fc2.bias",
               "head.w": "head.weight", "head.b": "head.bias", "lstm.w_ih": "lstm.weight_ih",
               "lstm.w_hh": "lstm.weight_hh", "lstm.b_ih": "lstm.bias_ih", "lstm.b_hh": "lstm.bias_hh"}


def fp32_actor(path: str, clip: bool = True) -> dict[str, np.ndarray]:
    """The same checkpoint's actor in fp32 (see fp32_arrays)."""
    from sacbot.store import checkpoint as ck
    return fp32_arrays(ck.read_checkpoint(path, entries=("model", "actor"))["arrays"], clip)


def fp32_arrays(arrays: dict[str, np.ndarray], clip: bool = True) -> dict[str, np.ndarray]:
    """A checkpoint's arrays (model and actor entries) as an fp32 actor for sacbot.acting.policy.

    With ``clip`` (the fair comparison) the quantizers' ranges stay and only their rounding goes:
    each layer's input is clipped to the range its quantizer learned, as a float on a grid 2**12
    times finer, and each weight to its row's range (Qp times its scale), as the trained actor's
    forward clamps it.  The QAT actor learns to rely on both clips (on Pendulum-P, 28% of fc2's
    inputs lay outside their range; on one Pendulum-V actor 9-28% of each layer's latent weights
    lay outside theirs, which LSQ's forward never used), so without them the float net is another
    function.  Without ``clip``: the bare latent float weights."""
    out = {k: np.asarray(arrays["actor." + v], np.float32) for k, v in _FP32_NAMES.items()}
    out["meta.sizes"] = arrays["export.meta.sizes"]
    out["meta.quantized"] = np.array(False)
    if clip:
        fine = 2**12
        from sacbot.learning.quant import qrange  # the grid the trained forward clamped weights to
        qp = qrange(int(arrays["export.meta.bits"]), signed=True)[1]
        for layer in ("fc1", "lstm", "fc2", "head"):
            if f"export.{layer}.x_scale" in arrays:
                out[f"{layer}.x_scale"] = np.float32(arrays[f"export.{layer}.x_scale"] / fine)
                out[f"{layer}.x_range"] = arrays[f"export.{layer}.x_range"] * fine
        for k in _FP32_NAMES:  # float weights: unit scales (sacbot.acting.policy multiplies by them)
            if f"export.{k}_scale" in arrays:
                limit = qp * np.asarray(arrays[f"export.{k}_scale"], np.float32).reshape(-1, 1)
                out[k] = np.clip(out[k], -limit, limit)
                out[f"{k}_scale"] = np.ones_like(arrays[f"export.{k}_scale"])
    return out


# --- training runs --------------------------------------------------------------------------
def sacbot_run(a, env_id: str, seed: int, memoryless: bool) -> str:
    """Train one lockstep run; return its weights directory."""
    d = tempfile.mkdtemp(prefix=f"sacbot-learn-{seed}-")
    cmd = [sys.executable, "-m", "sacbot", "run", "--env", env_id, "--pace", "lockstep",
           "--steps", str(a.steps), "--seed", str(seed), "--save-interval", str(a.eval_every),
           "--keep-last", "1000", "--no-save-replay", "--quiet",
           "--run-dir", os.path.join(d, "run"), "--weights-path", os.path.join(d, "w"),
           *(["--memoryless"] if memoryless else []), *shlex.split(a.sacbot_args)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"sacbot run failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return os.path.join(d, "w")


def sacbot_curve(a, env_id: str, seed: int, memoryless: bool) -> dict:
    from sacbot.store import checkpoint as ck
    wdir = sacbot_run(a, env_id, seed, memoryless)
    curve = []
    steps = ck.step_files(wdir)
    for _, path in steps:
        env_steps = int(ck.read_checkpoint(path, entries=("training",))["meta"]["env_steps"])
        rin = bool(checkpoint_config(path).get("reward_input"))
        curve.append((env_steps, evaluate_actor(int8_actor(path), env_id, a.episodes, seed, memoryless, rin)))
    out = {"curve": curve, "weights": wdir}
    if a.int8_vs_fp32 and steps:
        last = steps[-1][1]
        rin = bool(checkpoint_config(last).get("reward_input"))
        out["fp32_final"] = evaluate_actor(fp32_actor(last), env_id, a.episodes, seed, memoryless, rin)
        out["fp32_noclip_final"] = evaluate_actor(fp32_actor(last, clip=False), env_id, a.episodes, seed,
                                                  memoryless, rin)
    return out


def sb3_curve(a, env_id: str, seed: int, marks: list[int]) -> dict | None:
    try:
        import gymnasium as gym
        from stable_baselines3 import SAC
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.logger import Logger
    except ImportError:
        return None
    import torch

    import sacbot.envs  # noqa: F401

    torch.set_num_threads(1)
    if getattr(gym.make(env_id).unwrapped, "critic_obs", 0):  # SB3's actor would read them
        raise SystemExit(f"bench_learning: {env_id} ends its observation in values for sacbot's critic alone; "
                         "the SB3 baseline cannot keep them from its actor")
    model = SAC("MlpPolicy", gym.make(env_id), seed=seed, verbose=0, learning_starts=1000, device="cpu")
    # A logger with no outputs: SB3's default makes an empty SB3-<time> folder in the temp folder every run.
    model.set_logger(Logger(folder=None, output_formats=[]))
    curve: list[tuple[int, float]] = []

    class Marks(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps in marks:
                curve.append((self.num_timesteps, sb3_eval(model, env_id, a.episodes, seed)))
            return True

    model.learn(total_timesteps=a.steps, callback=Marks())
    return {"curve": curve}


def sb3_eval(model, env_id: str, episodes: int, seed: int) -> float:
    import gymnasium as gym

    env, rets = gym.make(env_id), []
    for ep in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED0 + seed * 100 + ep)
        done, ret = False, 0.0
        while not done:
            act, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(act)
            ret += float(r)
            done = term or trunc
        rets.append(ret)
    return float(np.mean(rets))


# --- the comparison ---------------------------------------------------------------------------
def marks_for(a) -> list[int]:
    """SB3's eval marks when no sacbot curve sets them: every eval_every steps after learning
    starts, and the last step."""
    return sorted({*range(1000 + a.eval_every, a.steps, a.eval_every), a.steps})


def run_env(a, env_id: str) -> dict:
    res: dict = {v: {} for v in a.variants}
    for seed in a.seeds:
        marks = None
        for v in a.variants:
            if v == "sb3":
                r = sb3_curve(a, env_id, seed, marks or marks_for(a))
                if r is None:
                    print("stable-baselines3 not installed (pip install -e '.[bench]'): SB3 skipped",
                          file=sys.stderr)
                    continue
            else:
                r = sacbot_curve(a, env_id, seed, memoryless=v == "memoryless")
                marks = marks or [s for s, _ in r["curve"]]
            res[v][seed] = r
            line = ", ".join(f"{s}:{x:.0f}" for s, x in r["curve"])
            fp = f"  fp32 final {r['fp32_final']:.0f}" if "fp32_final" in r else ""
            print(f"{env_id} {v:10s} seed {seed}: {line}{fp}", file=sys.stderr, flush=True)
    return res


def summary(res: dict) -> dict:
    """Per variant: each seed's final eval return, their mean and median; int8 against fp32."""
    out = {}
    for v, seeds in res.items():
        finals = [r["curve"][-1][1] for r in seeds.values() if r["curve"]]
        if not finals:
            continue
        out[v] = {"final": finals, "mean": statistics.fmean(finals), "median": statistics.median(finals)}
        for key in ("fp32_final", "fp32_noclip_final"):
            fp = [r[key] for r in seeds.values() if key in r]
            if fp:
                out[v][key] = fp
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["sacbot/Pendulum-P-v0", "sacbot/Pendulum-V-v0"])
    p.add_argument("--variants", nargs="+", default=["sacbot", "memoryless", "sb3"],
                   choices=["sacbot", "memoryless", "sb3"])
    p.add_argument("--steps", type=int, default=25000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-every", type=int, default=4000, help="gradient steps between evaluated checkpoints")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--int8-vs-fp32", action="store_true",
                   help="also evaluate each sacbot run's final checkpoint with its fp32 actor")
    p.add_argument("--sacbot-args", default="", help="extra flags for both sacbot variants, one string")
    a = p.parse_args()
    out: dict = {"bench": "learning", "steps": a.steps, "seeds": a.seeds, "episodes": a.episodes,
                 "sacbot_args": a.sacbot_args, "envs": {}}
    for env_id in a.envs:
        res = run_env(a, env_id)
        out["envs"][env_id] = {"runs": res, "summary": summary(res)}
        print(f"{env_id}: {json.dumps(out['envs'][env_id]['summary'])}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
