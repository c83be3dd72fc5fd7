"""POMDP benchmark wrappers after pomdp-baselines (Ni et al. 2022): Pendulum that shows
only the angle (Pendulum-P: cos, sin) or only the angular velocity (Pendulum-V)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class KeepObservationIndices(gym.ObservationWrapper):
    """Keep only some entries of a Box observation."""

    def __init__(self, env: gym.Env, indices):
        super().__init__(env)
        self.indices = np.asarray(indices, dtype=np.int64)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[self.indices], box.high[self.indices],
                                                (len(self.indices),), box.dtype)

    def observation(self, observation):
        return np.asarray(observation)[self.indices]


def pendulum_p(**kwargs) -> gym.Env:
    return KeepObservationIndices(gym.make("Pendulum-v1", **kwargs), [0, 1])  # cos, sin of the angle


def pendulum_v(**kwargs) -> gym.Env:
    return KeepObservationIndices(gym.make("Pendulum-v1", **kwargs), [2])  # angular velocity
