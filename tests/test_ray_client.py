"""A bot's client of the Ray learner (sacbot.app.ray_client), with Ray replaced by a stand-in."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sacbot.wire.messages import make_transition

pytestmark = pytest.mark.timeout(60)


def tr(i=0.0, term=False, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], term, trunc, obs_dim=3, act_dim=1)


def test_a_ray_bot_sends_what_it_queued_before_closing(monkeypatch):
    """A bot's sender closes with one last call for what waits in its outbox: here the close comes
    while a send call is in progress and more transitions wait, which were left behind before."""
    from sacbot.app import ray_client
    from sacbot.wire.channels import transitions_in
    from sacbot.wire.messages import decode_batch

    gate, in_call = threading.Event(), threading.Event()
    got: list[int] = []

    def send(source, data, info, seq):
        in_call.set()
        assert gate.wait(30), "the test never let the first call finish"
        got.append(sum(transitions_in(m) for m in decode_batch(data)))
        return "ref"

    # The actor's methods, called in the sender's and the puller's threads.
    learner = SimpleNamespace(send=SimpleNamespace(remote=send),
                              pull=SimpleNamespace(remote=lambda version: None),
                              status=SimpleNamespace(remote=lambda: {"learner_alive": True}))

    class FakeRay:  # refs are the values: every call has finished by the time it returns
        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            return refs[:num_returns], refs[num_returns:]

        @staticmethod
        def get(ref, timeout=None):
            return ref

    monkeypatch.setattr(ray_client, "require_ray", lambda: FakeRay)
    link = ray_client.RayLearnerClient(learner, source=0, queue_size=64)
    assert link.send([tr(i) for i in range(64)]) == 64  # a full call: sent at once
    assert in_call.wait(30)
    assert link.send([tr(i) for i in range(10)]) == 10  # queued while that call is on its way
    closer = threading.Thread(target=link.close, name="test-close")
    closer.start()
    assert link._stop.wait(30)  # the close has told the sender
    gate.set()
    closer.join(30)
    assert not closer.is_alive()
    assert got == [64, 10]
