"""The acting side's errors: what a game loop's calls and a bot's start raise."""

from __future__ import annotations


class AgentError(RuntimeError):
    """The agent cannot start or was used wrongly; the message says what to do."""


class AgentInterrupted(AgentError):
    """The stop request came while the agent was starting: nothing was saved or left running."""
