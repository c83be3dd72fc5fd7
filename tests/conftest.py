"""Fixtures shared by the tests (helpers that are plain functions live in helpers.py)."""

from __future__ import annotations

import os
import signal

import pytest

from sacbot.wire.boundary import LEARNER_KINDS


def pytest_configure(config) -> None:
    # `make test` runs one xdist worker per core; torch's default of one intra-op thread per core
    # in every worker would put twice as many busy threads as cores, and they spin against each
    # other.  sacbot's own learner threads already default to one (Config.torch_threads).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(params=LEARNER_KINDS)
def learner_kind(request) -> str:
    """Run a test once with the thread learner and once with the process learner: both
    implement the same boundary and must pass the same suite."""
    return request.param


def break_learner(agent, kind: str) -> str:
    """Make the agent's learner fail the way it would in the field; returns what the error says."""
    if kind == "thread":
        def boom(batch):
            raise RuntimeError("injected learner failure")

        agent.learner.loop.state.learner.update = boom
        return "injected learner failure"
    os.kill(agent.learner.proc.pid, signal.SIGKILL)
    return "exited with code -9"
