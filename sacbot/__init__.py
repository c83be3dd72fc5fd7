"""sacbot: a runtime for bots that learn while they play.

A game loop holds an :class:`Agent`; its ``act`` answers every tick in numpy and never waits,
while a learner (a thread, a child process or a Ray actor) trains on what ``observe`` sends::

    from sacbot import Agent, load_config
    with Agent(load_config(), obs_space, action_space) as agent:
        agent.new_episode(opponent="tracker")
        action = agent.act(obs)
        agent.observe(reward, next_obs, terminated, truncated, info)

Importing ``sacbot`` is light: the names below are imported on first use, and the acting side
never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Agent", "AgentError", "Config", "ConfigError", "load_config", "__version__"]

if TYPE_CHECKING:
    from sacbot.acting.agent import AgentError
    from sacbot.assembly.bot import Agent
    from sacbot.config import Config, ConfigError, load_config

_LAZY = {"Agent": "assembly.bot", "AgentError": "acting.agent", "Config": "config", "ConfigError": "config",
         "load_config": "config"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"sacbot.{_LAZY[name]}"), name)
        globals()[name] = value  # once imported, a plain attribute
        return value
    raise AttributeError(f"module 'sacbot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
