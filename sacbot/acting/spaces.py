"""The spaces a bot plays: checked once at its start, and recorded with its checkpoints."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sacbot.acting.errors import AgentError
from sacbot.config import Config


def space_dims(obs_space: gym.Space, action_space: gym.Space) -> tuple[int, int]:
    if not isinstance(obs_space, gym.spaces.Box):
        raise AgentError(f"observation space {obs_space} is not supported: sacbot needs a Box "
                         "(wrap Dict/Tuple spaces in gymnasium.wrappers.FlattenObservation)")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise AgentError(f"action space {action_space} is not supported: sacbot needs a 1-D Box")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise AgentError(f"action space {action_space} is unbounded: SAC squashes actions with "
                         "tanh and needs finite low/high")
    with np.errstate(over="ignore", invalid="ignore"):  # the acting policy scales in float32
        span = (action_space.high.astype(np.float32) - action_space.low.astype(np.float32)) / 2
    if not np.isfinite(span).all():
        raise AgentError(f"action space {action_space} is too wide: its bounds must be finite as float32 and "
                         "(high - low) too, or act() would return inf/NaN; rescale the actions")
    return int(np.prod(obs_space.shape)), int(action_space.shape[0])


def input_dim(cfg: Config, obs_dim: int) -> int:
    """The networks' observation input: the env's, plus the previous reward with ``reward_input``.
    The learner only ever sees this (its replay stores observations with the reward appended)."""
    return obs_dim + int(cfg.reward_input)


def reward_feature(reward: float, squash: str) -> np.float32:
    """The value reward_input appends for the previous reward: as given, or symlog-squashed."""
    if squash == "symlog":
        return np.float32(np.sign(reward) * np.log1p(abs(reward)))
    return np.float32(reward)


def learner_spaces(net_obs: int, obs_space: gym.Space, action_space: gym.Space, env_layout: dict | None = None) -> dict:
    """What a learner saves of the game with its bot (the manifest's ``spaces``): the networks'
    input size, the spaces, and the env's layout kwargs (sacbot.acting.games.env_layout), which a later
    resume or eval is checked against."""
    spaces = {"obs_dim": net_obs, "act_dim": int(np.prod(action_space.shape)), "obs_shape": list(obs_space.shape),
              "action_low": np.asarray(action_space.low, np.float32).tolist(),
              "action_high": np.asarray(action_space.high, np.float32).tolist()}
    if env_layout:
        spaces["env_layout"] = dict(env_layout)
    return spaces
