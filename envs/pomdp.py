"""Partially observed versions of any Box task, after pomdp-baselines (Ni et al. 2022) and DRQN's
flickering (Hausknecht and Stone 2015), as wrappers anyone can put around their env:

* **P**: positions only (velocities hidden), **V**: velocities only, from a per-task table of
  which observation values are which (``VIEWS``);
* **F**: flickering, each observation blanked (all zeros) with probability ``p``, from the
  wrapper's own generator, seeded by ``reset(seed=...)``, so a seed repeats its blanks and the
  task's own randomness is not touched.

    env = partially_observed("MountainCarContinuous-v0", "V")     # or gym.make("sacbot/MountainCarContinuous-V-v0")
    env = Flicker(gym.make("Pendulum-v1"), p=0.2)                 # any Box env

Registered ids (``sacbot.envs``): ``sacbot/<Task>-P-v0``, ``-V-v0`` and ``-F-v0`` for each task of
``VIEWS`` (LunarLander needs gymnasium's box2d extra, InvertedDoublePendulum the mujoco wheel).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

# Which values of each task's observation are positions (P) and which velocities (V).  Contact
# flags are neither and stay in both, as pomdp-baselines keeps them; a constraint force is dropped.
VIEWS: dict[str, dict[str, tuple[int, ...]]] = {
    "Pendulum-v1": {"P": (0, 1), "V": (2,)},  # cos, sin of the angle | angular velocity
    "MountainCarContinuous-v0": {"P": (0,), "V": (1,)},  # position | velocity
    # x, y, vx, vy, angle, angular velocity, left and right leg contact
    "LunarLanderContinuous-v3": {"P": (0, 1, 4, 6, 7), "V": (2, 3, 5, 6, 7)},
    # cart x, sin and cos of both links | cart and link velocities (index 8, a constraint force, dropped)
    "InvertedDoublePendulum-v5": {"P": (0, 1, 2, 3, 4), "V": (5, 6, 7)},
}
FLICKER_P = 0.2  # the default blanking probability of the registered -F ids


class KeepObservationIndices(gym.ObservationWrapper):
    """Keep only some entries of a 1-D Box observation."""

    def __init__(self, env: gym.Env, indices):
        super().__init__(env)
        box = env.observation_space
        if not isinstance(box, gym.spaces.Box) or len(box.shape) != 1:
            raise ValueError(f"KeepObservationIndices needs a 1-D Box observation space, got {box}")
        self.indices = np.asarray(indices, dtype=np.int64)
        if len(self.indices) == 0 or self.indices.min() < 0 or self.indices.max() >= box.shape[0]:
            raise ValueError(f"indices {list(self.indices)} are not within the observation's {box.shape[0]} values")
        self.observation_space = gym.spaces.Box(box.low[self.indices], box.high[self.indices],
                                                (len(self.indices),), box.dtype)

    def observation(self, observation):
        return np.asarray(observation)[self.indices]


class Flicker(gym.ObservationWrapper):
    """Each observation, the first of an episode included, is all zeros with probability ``p``."""

    def __init__(self, env: gym.Env, p: float = FLICKER_P):
        super().__init__(env)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p = {p!r} is not accepted: expected a probability in [0, 1)")
        box = env.observation_space
        if not isinstance(box, gym.spaces.Box):
            raise ValueError(f"Flicker needs a Box observation space, got {box}")
        # A blank must be a valid observation: zeros, clipped into the space's bounds.
        self.blank = np.clip(np.zeros(box.shape, box.dtype), box.low, box.high)
        self.p = float(p)
        self.blanked = 0
        self._rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # its own stream, apart from the task's: the task plays as unwrapped
            self._rng = np.random.default_rng([seed, 0x5ACB07])
        return super().reset(seed=seed, options=options)

    def observation(self, observation):
        if self._rng.random() < self.p:
            self.blanked += 1
            return self.blank.copy()
        return observation


def partially_observed(task: str, view: str, p: float = FLICKER_P, **kwargs) -> gym.Env:
    """``task`` (a key of ``VIEWS``) with only its positions (``"P"``), only its velocities
    (``"V"``), or flickering (``"F"``, blanked with probability ``p``)."""
    if task not in VIEWS:
        raise ValueError(f"no observation table for {task!r}; known: {', '.join(VIEWS)} (Flicker wraps any Box env)")
    if view == "F":
        return Flicker(gym.make(task, **kwargs), p=p)
    if view not in VIEWS[task]:
        raise ValueError(f"view = {view!r} is not accepted: expected P, V or F")
    return KeepObservationIndices(gym.make(task, **kwargs), VIEWS[task][view])


def pendulum_p(**kwargs) -> gym.Env:
    return partially_observed("Pendulum-v1", "P", **kwargs)


def pendulum_v(**kwargs) -> gym.Env:
    return partially_observed("Pendulum-v1", "V", **kwargs)
