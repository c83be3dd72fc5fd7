"""``sacbot.Agent``: the acting loop, started by the assembly.

    with sacbot.Agent(cfg, obs_space, action_space) as agent:
        agent.new_episode(opponent="tracker")
        action = agent.act(obs)
        agent.observe(reward, next_obs, terminated, truncated, info)

The loop itself is :class:`sacbot.acting.agent.Agent`, which never imports the learning side; this
subclass only gives it the assembly's start (eval, pretrained, resume or fresh, and its learner).
"""

from __future__ import annotations

import threading

import gymnasium as gym

from sacbot.acting import agent as acting
from sacbot.assembly.assemble import assemble
from sacbot.config import Config
from sacbot.console import Log


class Agent(acting.Agent):
    __doc__ = acting.Agent.__doc__

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, *, logger: Log | None = None,
                 learner=None, env_layout: dict | None = None, stop: threading.Event | None = None):
        super().__init__(cfg, obs_space, action_space, start_with=assemble, logger=logger, learner=learner,
                         env_layout=env_layout, stop=stop)
