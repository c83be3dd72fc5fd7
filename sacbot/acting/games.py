"""The game as gymnasium gives it: make an env, flatten its observation, read what it declares.

    env = make_env("sacbot/TankDuel-v0", kwargs={"opponents": ["tracker"]})   # AgentError if it cannot
    cfg = with_env_critic_obs(cfg, env)     # the env's own count of critic-only values
    layout = env_layout(env)                # saved with the bot: resumes under another are refused

Acting side: gymnasium and numpy, never torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys

import gymnasium as gym

from sacbot.acting.agent import AgentError
from sacbot.config import Config, ConfigError, log


class GameImportError(ImportError):
    """``--env module:Name`` whose module does not import, or that names no env: exit 2."""


def gym_make(env_id: str, **kwargs) -> gym.Env:
    """``gym.make`` for every form ``--env`` takes: a registered id (``Pendulum-v1``,
    ``sacbot/TankDuel-v0``), ``module:EnvId`` (the module registers the id when imported, as
    gymnasium's own ``gym.make("module:EnvId")``), or ``module:ClassName`` (a gymnasium.Env
    subclass, made with the kwargs).  The working directory is importable for the module, as it is
    for ``python -m``: a console script's ``sys.path`` does not hold it."""
    from sacbot import envs  # noqa: F401 - registers sacbot's envs (the repo's envs/, installed as sacbot.envs)

    if ":" not in env_id:
        return gym.make(env_id, **kwargs)
    module_name, name = env_id.split(":", 1)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # after everything installed: a file here never shadows a package
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import is theirs to see
        raise GameImportError(f"--env {env_id!r}: module {module_name!r} does not import ({type(e).__name__}: "
                              f"{e}); expected a module on the path or in the working directory "
                              f"({os.getcwd()})") from None
    cls = getattr(module, name, None)
    if isinstance(cls, type) and issubclass(cls, gym.Env):
        env = cls(**kwargs)
        spec = getattr(cls, "max_episode_steps", None)
        return gym.wrappers.TimeLimit(env, spec) if isinstance(spec, int) and spec > 0 else env
    if name in gym.registry:
        return gym.make(name, **kwargs)
    raise GameImportError(f"--env {env_id!r}: module {module_name!r} imports, but {name!r} is neither a "
                          "gymnasium.Env subclass in it nor an id it registers; expected module:ClassName or "
                          "module:EnvId")


def make_env(env_id: str, render_mode: str | None = None, kwargs: dict | None = None) -> gym.Env:
    # render_mode only when asked for: gymnasium passes even None on to the env's constructor,
    # and an env written without a render_mode argument would fail on it.
    extra = {} if render_mode is None else {"render_mode": render_mode}
    try:
        env = gym_make(env_id, **extra, **(kwargs or {}))
    except GameImportError as e:
        raise AgentError(str(e)) from None
    except (gym.error.Error, TypeError, ValueError) as e:
        raise AgentError(f"cannot make env {env_id!r} with kwargs {kwargs or {}}: {e}") from None
    return flatten_if_nested(env)


def with_env_critic_obs(cfg: Config, env: gym.Env) -> Config:
    """``cfg`` with the env's own count of critic-only observation values (its ``critic_obs``
    attribute, as sacbot/TankDuelRadar-v1 declares): an actor that read them would see what the
    game hides from the player, so the env's word is not left to a flag.  An env whose reward is
    computed from hidden state (its ``privileged_reward`` attribute: TankDuel's shaping) refuses
    reward_input, which would hand that reward to the actor as an input."""
    if cfg.reward_input and getattr(env.unwrapped, "privileged_reward", False):
        raise ConfigError(f"reward_input = True, but {cfg.env}'s reward is computed from state the actor must not see "
                          "(its privileged_reward): as an input it would tell the actor what the game hides; turn "
                          "reward_input off")
    declared = getattr(env.unwrapped, "critic_obs", 0)
    if not cfg.critic_memory and not cfg.memoryless and not (declared or cfg.critic_obs) and not cfg.eval_mode:
        # TankDuelRadar-v1's preset turns the critic's memory off because the env gives it the hidden
        # state; with critic_info off the critic would learn from neither (a partial view alone).
        log.warning("critic_memory is off, but %s gives the critic no values of its own (critic_obs 0): the "
                    "critic sees neither the history nor the hidden state; pass --critic-memory if the "
                    "game hides state", cfg.env)
    if not declared or cfg.critic_obs == declared:
        return cfg
    if cfg.critic_obs:
        raise ConfigError(f"critic_obs = {cfg.critic_obs}, but {cfg.env} declares its last {declared} observation "
                          f"values critic-only; leave critic_obs unset (or {declared}); a bot trained with another "
                          "critic_obs cannot go on in this game")
    log.info("%s declares its last %d observation values critic-only: the actor never reads them "
             "(critic_obs=%d)", cfg.env, declared, declared)
    return dataclasses.replace(cfg, critic_obs=declared)


def env_layout(env: gym.Env) -> dict | None:
    """The values of the kwargs the env declares change what its observations or actions mean
    (its ``layout_kwargs``, e.g. TankDuel's gun_control), or None if it declares none.  Saved with
    the bot, so that a resume or eval under other values is refused (Config.transfer).  As JSON
    gives them back (a tuple as a list, an odd object as its repr), so a saved layout compares
    equal to the same one made again."""
    keys = getattr(env.unwrapped, "layout_kwargs", ())
    layout = {k: getattr(env.unwrapped, k) for k in keys}
    return json.loads(json.dumps(layout, default=repr)) if layout else None


def saved_layout(saved_cfg: dict) -> dict | None:
    """The layout a checkpoint from before ``env_layout`` was saved (or a pretrained bot) was
    trained under: its env made again with its saved id and kwargs.  None if it cannot be."""
    try:
        kwargs = json.loads(saved_cfg.get("env_kwargs") or "{}")
        env = make_env(saved_cfg["env"], kwargs=kwargs if isinstance(kwargs, dict) else {})
    except Exception:  # noqa: BLE001 - an env that no longer makes is not compared, as before the field
        return None
    try:
        return env_layout(env)
    finally:
        env.close()


def flatten_if_nested(env: gym.Env) -> gym.Env:
    """Dict and Tuple observations reach the agent flattened into one Box."""
    if isinstance(env.observation_space, gym.spaces.Dict | gym.spaces.Tuple):
        env = gym.wrappers.FlattenObservation(env)
    return env
