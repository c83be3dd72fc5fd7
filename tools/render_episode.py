#!/usr/bin/env python3
"""Write a GIF of one TankDuel episode, played by a checkpoint's actor or a random policy.

    python tools/render_episode.py --weights weights/sac_latest.zip --out duel.gif
    python tools/render_episode.py --random --opponent spinner --out random.gif

Needs Pillow (the ``plot`` extra: pip install -e '.[plot]').
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--weights", help="checkpoint zip whose actor plays")
    src.add_argument("--random", action="store_true", help="a uniformly random policy plays")
    p.add_argument("--opponent", default="sitting_duck")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-ticks", type=int, default=600)
    p.add_argument("--every", type=int, default=2, help="keep every Nth frame (GIF size)")
    p.add_argument("--out", default="episode.gif")
    a = p.parse_args()
    # Everything a bad flag breaks is checked here, before the episode is played.
    for flag, value, least in (("--seed", a.seed, 0), ("--max-ticks", a.max_ticks, 1), ("--every", a.every, 1)):
        if value < least:
            p.error(f"{flag} wants an integer >= {least}, got {value}")
    if not a.out.lower().endswith(".gif"):
        p.error(f"--out wants a file name ending in .gif, got {a.out!r}")
    parent = os.path.dirname(a.out) or "."
    if os.path.isdir(a.out) or not os.path.isdir(parent):
        p.error(f"--out wants a .gif file in an existing directory, got {a.out!r}")
    try:
        from PIL import Image
    except ImportError:
        print("render_episode: Pillow is not installed; install the plot extra: pip install -e '.[plot]'",
              file=sys.stderr)
        return 2
    from bench_tankduel import TANKDUEL_ENVS, eval_env  # this script's own directory: tools/

    import sacbot.envs  # noqa: F401 - registers TankDuel
    from sacbot.acting import policy
    from sacbot.envs.tank_duel import OPPONENTS
    from sacbot.store.checkpoint import CheckpointError, load_actor, read_checkpoint

    if a.opponent not in OPPONENTS:
        p.error(f"--opponent: unknown opponent {a.opponent!r}; known: {', '.join(sorted(OPPONENTS))}")
    # The duel the bot trained in (its env and kwargs, e.g. gun_control), against --opponent.
    cfg: dict = {"env": "sacbot/TankDuel-v0"}
    params = st = None
    memoryless = False
    if a.weights:
        try:
            params = policy.build_params(load_actor(a.weights))
            cfg = read_checkpoint(a.weights, entries=("actor",))["manifest"].get("config", {})
        except (CheckpointError, OSError, ValueError) as e:
            print(f"render_episode: cannot load {a.weights}: {e}", file=sys.stderr)
            return 1
        if cfg.get("env") not in TANKDUEL_ENVS:
            p.error(f"--weights {a.weights} trained on {cfg.get('env')}; only the TankDuel envs "
                    f"({', '.join(TANKDUEL_ENVS)}) can be rendered")
        memoryless = bool(cfg.get("memoryless"))
        st = policy.initial_state(params)
    # eval_env appends the previous reward to the observation where the actor trained so.
    try:
        env = eval_env(cfg, {"opponents": [a.opponent], "schedule": "fixed", "max_ticks": a.max_ticks,
                             "render_mode": "rgb_array"})
    except (TypeError, ValueError) as e:  # the manifest's env_kwargs: not JSON, or not this env's
        print(f"render_episode: cannot make {a.weights}'s env {cfg['env']}: {e}", file=sys.stderr)
        return 1
    obs, _ = env.reset(seed=a.seed)
    rng = np.random.default_rng(a.seed)
    frames, ret, done, t = [], 0.0, False, 0
    while not done:
        if params is not None:
            if memoryless:
                st = policy.initial_state(params)
            action, st = policy.act(params, obs, st)
        else:
            action = rng.uniform(-1, 1, 4).astype(np.float32)
        obs, r, term, trunc, info = env.step(action)
        ret += r
        done = term or trunc
        if t % a.every == 0 or done:
            frames.append(Image.fromarray(env.render()))
        t += 1
    frames[0].save(a.out, save_all=True, append_images=frames[1:], duration=int(1000 / 30 * a.every), loop=0)
    outcome = "won" if info["won"] else "lost" if info["lost"] else "time limit"
    print(f"{a.out}: {len(frames)} frames, {t} ticks, return {ret:.1f}, {outcome} against {a.opponent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
