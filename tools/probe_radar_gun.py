#!/usr/bin/env python3
"""What a TankDuel actor does with its gun on ticks it sees the enemy, and on ticks it does not.

The radar duel was long not learnt (until the critic without memory; docs/experiments.md).  A
memoryless hand-written policy wins it by holding the gun still between sightings
(tools/bench_radar_bounds.py); this tool asks whether a learnt actor does.
It plays each checkpoint's int8 actor deterministically (as tools/bench_tankduel.py: the
same episode seeds, the env the run trained in) in the radar duel at ``--arc`` degrees, and splits
the ticks by whether the enemy was in the observation.  Per group: the mean |gun turn| (action 2, where 1 is 20
degrees a tick), the mean change of the gun's true bearing error to the enemy over the tick, in
degrees (negative: the tick brought the gun closer), and how well the turn follows the turn that
would close the error (a correlation; near 0: the gun turns without regard to where the enemy is),
and the std of the gun turn's Gaussian before the tanh, which is the noise the same actor adds to
its gun in training (0.1 is about 2 degrees a tick; the target is about 2.6 degrees wide at 400
units)::

    python tools/probe_radar_gun.py --runs r120=/tmp/w/sac_latest.zip --arc 120 --episodes 5

One JSON line per checkpoint; the last line holds them all.
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

from sacbot.acting import policy  # noqa: E402
from sacbot.envs.tank_duel import _bearing, _wrap  # noqa: E402
from sacbot.store import checkpoint as ck  # noqa: E402
from tools.bench_learning import checkpoint_config  # noqa: E402
from tools.bench_tankduel import SEED0, TANKDUEL_ENVS, eval_env, json_object, layout_change, repeated_names  # noqa: E402

# The duels whose registered observation is the radar's: the probe reads its 'seen' field.
RADAR_ENVS = tuple(e for e in TANKDUEL_ENVS if gym.spec(e).kwargs.get("observation") == "radar")


def gun_error_deg(env) -> float:
    """Signed bearing from our gun to the enemy in degrees, from the simulation (not the
    observation); a positive gun turn (action 2) reduces a positive error."""
    me, en = env.me, env.enemy
    return math.degrees(_wrap(_bearing(me, en.x, en.y) - me.gun))


def corr(x: np.ndarray, y: np.ndarray, m: np.ndarray) -> float | None:
    """Correlation of x and y over the ticks m, to 3 places; None where it is undefined."""
    if m.sum() < 2 or x[m].std() == 0 or y[m].std() == 0:
        return None
    return round(float(np.corrcoef(x[m], y[m])[0, 1]), 3)


def split_by_sight(seen: np.ndarray, gun_turn: np.ndarray, err_before: np.ndarray,
                   err_after: np.ndarray, gun_std: np.ndarray) -> dict:
    """Per group of ticks (enemy in the observation or not), from signed gun errors in degrees:
    tick count, mean |gun turn|, the mean change of |error| over the tick, the correlation of
    the turn with the turn that would close the error (error / 20 degrees, clipped to [-1, 1]),
    and the mean std of the gun turn's training noise; None where a group is empty or the
    correlation is undefined."""
    ideal = np.clip(err_before / 20.0, -1.0, 1.0)
    closer = np.abs(err_after) - np.abs(err_before)
    out = {}
    for name, m in (("seen", seen), ("unseen", ~seen)):
        n = int(m.sum())
        out[name] = {
            "ticks": n,
            "mean_abs_gun_turn": round(float(np.abs(gun_turn[m]).mean()), 3) if n else None,
            "gun_error_change_deg": round(float(closer[m].mean()), 2) if n else None,
            "corr_with_closing_turn": corr(gun_turn, ideal, m),
            "gun_noise_std": round(float(gun_std[m].mean()), 3) if n else None}
    return out


def critic_gun_slopes(path: str, cfg: dict, episodes: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """dQ/d(gun turn) of the checkpoint's critic (the mean of its twin heads) at each played
    action, the critic reading each episode from its start as the learner does (observation
    and previous action; a critic without memory, or the control's, each step alone).
    Positive: the critic would pay the actor to turn the gun clockwise."""
    import torch

    from sacbot.learning.sac import Critic
    arrays = ck.read_checkpoint(path, entries=("model",))["arrays"]
    obs_dim, act_dim = episodes[0][0].shape[1], episodes[0][1].shape[1]
    critic = Critic(obs_dim, act_dim, int(cfg["hidden"]))
    critic.load_state_dict({k[len("critic."):]: torch.as_tensor(v) for k, v in arrays.items()
                            if k.startswith("critic.")})
    slopes = []
    for obs, act in episodes:
        o = torch.as_tensor(obs).unsqueeze(1)  # (T, 1, obs): time-major, as the learner
        a = torch.as_tensor(act).unsqueeze(1)
        prev = torch.cat([torch.zeros_like(a[:1]), a[:-1]])
        if cfg.get("memoryless"):  # each step its own sequence, as the control learns
            o, prev = o.transpose(0, 1), torch.zeros_like(prev).transpose(0, 1)
        with torch.no_grad():
            hw = critic.head_input(critic.core(o, prev, cfg.get("critic_memory", True)))
        a_req = a.reshape(o.shape[0], o.shape[1], -1).clone().requires_grad_(True)
        critic.heads(hw, a_req).mean(0).sum().backward()
        slopes.append(a_req.grad.reshape(-1, act_dim)[:, 2].numpy().copy())
    return slopes


def probe(path: str, arc: float, episodes: int, env_kwargs: dict) -> dict:
    # The actor's own forward (as bench_tankduel's actor_fn plays it), for the std beside the action.
    params, cfg = policy.build_params(ck.load_actor(path)), checkpoint_config(path)  # its env: checked in main
    env = eval_env(cfg, {**env_kwargs, "radar_arc": arc})
    seen, turn, before, after, std, wins, played = [], [], [], [], [], 0, []
    for k in range(episodes):
        obs, _ = env.reset(seed=SEED0 + k, options={"episode_index": k})
        state, done, info = None, False, {}
        ep_obs, ep_act = [], []
        while not done:
            ep_obs.append(np.asarray(obs, np.float32))
            before.append(gun_error_deg(env.unwrapped))
            seen.append(bool(obs[11] > 0.5))
            if state is None or cfg.get("memoryless"):
                state = policy.initial_state(params)
            mu, log_std, h, c = policy.mean_and_log_std(params, np.asarray(obs, np.float32), state)
            a = np.tanh(mu).astype(np.float32)  # deterministic, as policy.act without an rng
            state = policy.PolicyState(h, c, a)
            ep_act.append(a)
            turn.append(float(a[2]))
            std.append(float(np.exp(log_std[2])))
            obs, _, term, trunc, info = env.step(a)
            after.append(gun_error_deg(env.unwrapped))
            done = term or trunc
        wins += bool(info["won"])
        played.append((np.stack(ep_obs), np.stack(ep_act)))
    seen_a, before_a = np.array(seen), np.array(before)
    r = split_by_sight(seen_a, np.array(turn), before_a, np.array(after), np.array(std))
    # Does the critic know which way the enemy is?  Its slope against the closing turn.
    slope = np.concatenate(critic_gun_slopes(path, cfg, played))
    ideal = np.clip(before_a / 20.0, -1.0, 1.0)
    for name, m in (("seen", seen_a), ("unseen", ~seen_a)):
        r[name]["critic_slope_corr"] = corr(slope, ideal, m)
    r.update(checkpoint=path, train_env_kwargs=cfg.get("env_kwargs"), arc=arc, episodes=episodes,
             won=wins / episodes)
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, metavar="NAME=CHECKPOINT",
                   help="checkpoint files (sac_latest.zip or sac_step_<N>.zip) of radar-duel runs")
    p.add_argument("--arc", type=float, default=40.0, help="radar arc in degrees to play at (default 40)")
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--env-kwargs", type=json_object, default={}, metavar="JSON",
                   help="more env kwargs laid over each checkpoint's own")
    a = p.parse_args()
    if not 0 < a.arc <= 360:
        p.error(f"--arc wants degrees in (0, 360], got {a.arc}")
    if a.episodes < 1:
        p.error(f"--episodes wants at least 1, got {a.episodes}")
    if "radar_arc" in a.env_kwargs:
        p.error("give the arc with --arc, not in --env-kwargs")
    runs = [spec.partition("=") for spec in a.runs]
    if repeated_names(a.runs):
        p.error(f"--runs: each NAME once, got {repeated_names(a.runs)} more than once")
    for spec, (name, sep, path) in zip(a.runs, runs):
        if not sep or not name.strip() or not os.path.isfile(path):
            p.error(f"--runs wants NAME=CHECKPOINT with a name and an existing file, got {spec!r}")
    # Each checkpoint, and the env it is played in, before any is played.
    for name, _, path in runs:
        try:
            cfg = checkpoint_config(path)
            ck.read_checkpoint(path, entries=("model",))  # the critic, read after play: checked now
        except ck.CheckpointError as e:
            print(f"probe_radar_gun: {e}", file=sys.stderr)
            return 1
        if cfg.get("env") not in RADAR_ENVS:
            p.error(f"--runs {name}: {path} trained on {cfg.get('env')}, not a radar duel (the probe "
                    "reads the radar observation's 'seen' field, index 11)")
        try:
            env = eval_env(cfg, {**a.env_kwargs, "radar_arc": a.arc})
        except (TypeError, ValueError) as e:
            p.error(f"--env-kwargs {json.dumps(a.env_kwargs)} does not make {name}'s env: {e}")
        why = layout_change(cfg, env)
        env.close()
        if why:
            p.error(f"--env-kwargs: {why}, for {name}")
    out = {"probe": "radar_gun", "arc": a.arc, "runs": {}}
    for name, _, path in runs:
        r = probe(path, a.arc, a.episodes, a.env_kwargs)
        print(json.dumps({"run": name, **r}), flush=True)
        out["runs"][name] = r
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
