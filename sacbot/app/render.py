"""``sacbot render``: a GIF of one episode, played by a checkpoint's actor (or a random policy).

    sacbot render weights/sac_latest.zip                          # the env the bot trained in
    sacbot render weights/sac_latest.zip --env-kwargs '{"opponents": ["spinner"]}' --out spinner.gif
    sacbot render --random --env Pendulum-v1 --out random.gif

The actor is the deployed int8 one, played deterministically by the numpy policy as ``sacbot
eval`` plays it: the same observation (the previous reward appended where it trained so), the
memoryless control's reset each tick, actions scaled to the env's bounds.  The env is the
checkpoint's own (id and kwargs from its manifest), with ``--env-kwargs`` laid over; it must
render ``rgb_array`` frames.  Needs Pillow (the ``plot`` extra).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np


class RenderError(Exception):
    """What stops a render that is not a bad flag: a checkpoint that cannot be read, an env that
    cannot be made or does not draw frames (exit 1)."""


@dataclass(frozen=True)
class RenderArgs:
    checkpoint: str | None  # None: a uniformly random policy plays --env
    out: str = "episode.gif"
    env: str | None = None  # the checkpoint's env when None
    env_kwargs: str = ""  # a JSON object laid over the env's kwargs
    seed: int = 0
    max_ticks: int = 1000
    every: int = 2  # keep every Nth frame


def check(a: RenderArgs) -> None:
    """Everything a bad flag breaks, before anything is loaded or played: ValueError naming it."""
    if a.checkpoint is None and not a.env:
        raise ValueError("--random needs --env (the env to play), e.g. --env Pendulum-v1")
    for flag, value, least in (("--seed", a.seed, 0), ("--max-ticks", a.max_ticks, 1), ("--every", a.every, 1)):
        if value < least:
            raise ValueError(f"{flag} = {value} is not accepted: expected an integer >= {least}")
    if not a.out.lower().endswith(".gif"):
        raise ValueError(f"--out = {a.out!r} is not accepted: expected a file name ending in .gif")
    parent = os.path.dirname(a.out) or "."
    if os.path.isdir(a.out) or not os.path.isdir(parent):
        raise ValueError(f"--out = {a.out!r} is not accepted: expected a .gif file in an existing directory")
    if a.env_kwargs:
        try:
            over = json.loads(a.env_kwargs)
        except ValueError as e:
            raise ValueError(f"--env-kwargs is not JSON ({e}): expected an object such as "
                             '\'{"opponents": ["spinner"]}\'') from None
        if not isinstance(over, dict):
            raise ValueError(f"--env-kwargs = {a.env_kwargs!r} is not accepted: expected a JSON object")


def render(a: RenderArgs) -> str:
    """Play one episode and write its frames as a GIF; the line to print.  ValueError: a bad
    flag; RenderError: what else stops it; ImportError: Pillow is missing."""
    check(a)
    # pygame's envs (Pendulum, the Box2D ones) draw off-screen in rgb_array mode; without a display
    # SDL still probes for one and prints an error.  A set value is the user's.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    from PIL import Image

    from sacbot.acting import policy
    from sacbot.acting.agent import AgentError
    from sacbot.acting.games import make_env
    from sacbot.store.checkpoint import CheckpointError, load_actor, read_checkpoint

    cfg: dict = {}
    params = None
    if a.checkpoint is not None:
        try:
            params = policy.build_params(load_actor(a.checkpoint))
            cfg = read_checkpoint(a.checkpoint, entries=("actor",))["manifest"].get("config", {})
        except (CheckpointError, OSError, ValueError, KeyError) as e:
            raise RenderError(f"cannot load {a.checkpoint}: {e}") from None
    env_id = a.env or cfg.get("env")
    if not env_id:
        raise RenderError(f"{a.checkpoint} does not record its env; name it with --env")
    try:
        # The checkpoint's kwargs are its env's: another env (--env) starts from none.
        saved = json.loads(cfg.get("env_kwargs") or "{}") if env_id == cfg.get("env") else {}
        kwargs = {**saved, **json.loads(a.env_kwargs or "{}")}
        env = make_env(env_id, render_mode="rgb_array", kwargs=kwargs)
    except (AgentError, ValueError) as e:
        raise RenderError(f"cannot make the env {env_id!r}: {e}") from None
    try:
        return _play(a, env, params, cfg, Image)
    finally:
        env.close()


def _play(a: RenderArgs, env, params, cfg: dict, image) -> str:
    from sacbot.acting import policy
    from sacbot.acting.spaces import reward_feature

    low = np.asarray(env.action_space.low, np.float32)
    half = (np.asarray(env.action_space.high, np.float32) - low) / 2
    rng = np.random.default_rng(a.seed)
    reward_input, memoryless = bool(cfg.get("reward_input")), bool(cfg.get("memoryless"))
    if params is not None and params.obs_dim != int(np.prod(env.observation_space.shape)) + reward_input:
        raise RenderError(f"the actor reads {params.obs_dim} values; {env.spec.id if env.spec else 'the env'} gives "
                          f"{int(np.prod(env.observation_space.shape))}"
                          f"{' and the previous reward' if reward_input else ''}: render it in the env it trained in")
    obs, _ = env.reset(seed=a.seed)
    state = policy.initial_state(params) if params is not None else None
    frames, ret, prev_r, t, done, info = [], 0.0, 0.0, 0, False, {}
    while not done and t < a.max_ticks:
        if params is None:
            u = rng.uniform(-1, 1, low.shape).astype(np.float32)
        else:
            x = np.asarray(obs, np.float32).ravel()
            if reward_input:
                x = np.append(x, reward_feature(prev_r, str(cfg.get("reward_input_squash", "off"))))
            if memoryless:
                state = policy.initial_state(params)
            u, state = policy.act(params, x, state)
        obs, r, term, trunc, info = env.step(low + (u + 1.0) * half)
        ret, prev_r = ret + float(r), float(r)
        done = term or trunc
        if t % a.every == 0 or done:
            frame = env.render()
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise RenderError(f"the env's render() gave {type(frame).__name__}, not an RGB frame: it must "
                                  "support render_mode='rgb_array'")
            frames.append(image.fromarray(frame))
        t += 1
    frames[0].save(a.out, save_all=True, append_images=frames[1:], duration=int(1000 / 30 * a.every), loop=0)
    won = info.get("won")
    outcome = "" if won is None else ", won" if won else ", lost"
    return f"{a.out}: {len(frames)} frames, {t} ticks, return {ret:.1f}{outcome}"
