"""Check the configured env before a run starts: make it, reset it, take one step.

A wrong env kwarg (``{"g": "abc"}`` for Pendulum-v1) passes ``gym.make`` and fails only
inside ``env.step``, after the agent would have started and written a step-0 checkpoint.
Stepping once up front turns it into a configuration error (exit 2) with
nothing written.  Torch-free, like the acting side: it runs before the learner exists.

    check_env(cfg)   # raises ConfigError naming env, env_kwargs and the error
"""

from __future__ import annotations

import json

from sacbot.config import Config, ConfigError


def check_env(cfg: Config) -> None:
    """Make ``cfg.env`` with ``cfg.env_kwargs``, check its spaces, reset it and step it once with a
    sampled action."""
    from sacbot import envs  # noqa: F401 - registers sacbot's envs (the repo's envs/, installed as sacbot.envs)
    from sacbot.acting.errors import AgentError
    from sacbot.acting.games import GameImportError, flatten_if_nested, gym_make
    from sacbot.acting.spaces import space_dims
    from sacbot.wire.messages import MAX_ABS_OBS, MessageError, check_reward, check_vector

    kwargs = cfg.env_kwargs_dict()
    stage = "make"
    env = None
    try:
        env = flatten_if_nested(gym_make(cfg.env, **kwargs))  # as the driver makes it
        obs_dim, _ = space_dims(env.observation_space, env.action_space)
        shape = env.observation_space.shape
        stage = "reset"
        obs, _ = env.reset(seed=cfg.seed)
        check_vector("its first observation", obs, obs_dim, shape, MAX_ABS_OBS)
        stage = "step"
        env.action_space.seed(cfg.seed)
        obs, reward, *_ = env.step(env.action_space.sample())
        # What the bot would refuse on its first tick (a kwarg that makes NaN), refused before any file.
        check_vector("the observation after one step", obs, obs_dim, shape, MAX_ABS_OBS)
        check_reward(reward)
    except GameImportError as e:  # --env module:Name whose module or name is wrong: it says which
        raise ConfigError(str(e)) from None
    except AgentError as e:  # spaces sacbot cannot drive (Discrete actions): the user's choice of env
        raise ConfigError(f"env = {cfg.env!r}: {e}") from None
    except MessageError as e:
        raise ConfigError(f"env = {cfg.env!r} with env_kwargs = {json.dumps(kwargs)} gives values sacbot cannot "
                          f"learn from at {stage}: {e}") from None
    except Exception as e:  # noqa: BLE001 - any failure of a user's env is a bad setting here
        raise ConfigError(f"env = {cfg.env!r} with env_kwargs = {json.dumps(kwargs)} fails at {stage}: "
                          f"{type(e).__name__}: {e}") from None
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing a probe env must not hide the real result
                pass
