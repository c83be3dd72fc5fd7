"""The game as gymnasium gives it: make an env, flatten its observation, read what it declares.

    env = make_env("sacbot/TankDuel-v0", kwargs={"opponents": ["tracker"]})   # AgentError if it cannot
    cfg = with_env_critic_obs(cfg, env)     # the env's own count of critic-only values
    layout = env_layout(env)                # saved with the bot: resumes under another are refused

Acting side: gymnasium and numpy, never torch.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym

from sacbot.acting.agent import AgentError
from sacbot.config import Config, ConfigError, log


def make_env(env_id: str, render_mode: str | None = None, kwargs: dict | None = None) -> gym.Env:
    from sacbot import envs  # noqa: F401 - registers sacbot's envs (the repo's envs/, installed as sacbot.envs)

    # render_mode only when asked for: gymnasium passes even None on to the env's constructor,
    # and an env written without a render_mode argument would fail on it.
    extra = {} if render_mode is None else {"render_mode": render_mode}
    try:
        env = gym.make(env_id, **extra, **(kwargs or {}))
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
                          f"values critic-only; leave critic_obs unset (or {declared})")
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
