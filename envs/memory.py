"""CueMemory: the smallest task that needs memory.

A cue of +1 or -1 is shown only in the first observation; after ``delay`` blank
steps a query step asks for an action whose first component has the cue's sign.
Reward at the query step is ``action[0] * cue`` (in [-1, 1]); every other step gives 0.
A memoryless policy cannot beat chance (50% success).

Observation: [cue (first step only, else 0), is_first, is_query].
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CueMemory(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, delay: int = 2, render_mode: str | None = None):
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(f"delay must be an integer >= 0 (blank steps between cue and query), got {delay!r}")
        if render_mode is not None:
            raise ValueError(f"CueMemory has nothing to render: render_mode must be None, got {render_mode!r}")
        self.delay, self.render_mode = delay, render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t = 0
        self._cue = 1.0

    def _obs(self) -> np.ndarray:
        first = self._t == 0
        query = self._t == self.delay + 1
        return np.array([self._cue if first else 0.0, float(first), float(query)], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {"cue": self._cue}

    def step(self, action):
        a = float(np.clip(np.asarray(action, dtype=np.float32).reshape(-1)[0], -1, 1))
        query = self._t == self.delay + 1
        reward = a * self._cue if query else 0.0
        success = query and np.sign(a) == self._cue
        self._t += 1
        return self._obs(), reward, bool(query), False, {"success": bool(success), "cue": self._cue}
