"""Check the configured env before a run starts: make it, reset it, take one step.

A wrong env kwarg (``{"g": "abc"}`` for Pendulum-v1) used to pass ``gym.make`` and fail
inside ``env.step`` only after the agent had started and written a step-0 checkpoint
(issue 14).  Stepping once up front turns it into a configuration error (exit 2) with
nothing written.  Torch-free, like the acting side: it runs before the learner exists.

    check_env(cfg)   # raises ConfigError naming env, env_kwargs and the error
"""

from __future__ import annotations

import json

import gymnasium as gym

from .config import Config, ConfigError


def check_env(cfg: Config) -> None:
    """Make ``cfg.env`` with ``cfg.env_kwargs``, check its spaces, reset it and step it once with a
    sampled action."""
    from . import envs  # noqa: F401 - registers sacbot's envs (the repo's envs/, installed as sacbot.envs)
    from .agent import AgentError, space_dims
    from .driver import flatten_if_nested

    kwargs = cfg.env_kwargs_dict()
    stage = "make"
    env = None
    try:
        env = flatten_if_nested(gym.make(cfg.env, **kwargs))  # as the driver makes it
        space_dims(env.observation_space, env.action_space)
        stage = "reset"
        env.reset(seed=cfg.seed)
        stage = "step"
        env.action_space.seed(cfg.seed)
        env.step(env.action_space.sample())
    except AgentError as e:  # spaces sacbot cannot drive (Discrete actions): the user's choice of env
        raise ConfigError(f"env = {cfg.env!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - any failure of a user's env is a bad setting here
        raise ConfigError(f"env = {cfg.env!r} with env_kwargs = {json.dumps(kwargs)} fails at {stage}: "
                          f"{type(e).__name__}: {e}") from None
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing a probe env must not hide the real result
                pass
