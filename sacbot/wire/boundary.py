"""The learner boundary: how a bot talks to its learner, in plain messages only.

A bot holds one :class:`Learner` and nothing else of the learning side.  Whether the learner is a
thread in this process (:mod:`sacbot.learning.thread_learner`), a child process
(:mod:`sacbot.learning.process_learner`) or a Ray actor that many bots feed, the acting loop is the same::

    learner = start_learner(...)                 # built by sacbot.assembly.assemble, never by the Agent
    version, params = 0, None
    while playing:
        got = learner.pull(version)              # newest actor, only if newer than ``version``
        if got is not None:
            version, arrays = got                # plain numpy arrays (the deployable actor)
            params = policy.build_params(arrays)
        action = policy.act(params, obs, state)  # numpy; never waits on the learner
        learner.send([Transition(...)])          # never blocks: a full queue drops and counts
        learner.status()                         # the LearnerStatus the learner last pushed
    final = learner.close(acting_rng)            # Shutdown after the data: drain, final save, exit
                                                 # (a LearnerStatus, with final_save)

The contract:

* ``send(msgs)`` takes :mod:`sacbot.wire.messages` objects (plain data; each has a msgpack wire form)
  and never blocks.  Transitions that find the queue full are dropped and counted in
  ``drops()``; control messages (``NewEpisode``) have reserved room (see :class:`Channel`).
* ``pull(version)`` returns ``(new_version, arrays)`` when the learner has published a newer
  actor, else None.  The arrays belong to the caller until its next pull.
* ``status()`` returns the learner's last pushed status, a :class:`sacbot.wire.status.LearnerStatus`
  (counters, losses, device, errors).  It is computed by the learner from its own objects; the
  acting side never touches them.
* ``wait_processed(n, timeout, stop)`` blocks until the learner has trained on the first ``n``
  transitions (lockstep pace only; never called from a real-time loop), or until ``stop`` (a
  ``threading.Event``: the bot's stop request) is set: a close never waits for a slow learner.
* ``close(acting_rng)`` sends ``Shutdown`` after the data.  The learner moves what is queued into
  its buffer without training on it, makes the final save (blocking, guaranteed unless the
  learner's state is not finite), stops its writer and exits; ``close`` returns its final status
  with ``final_save = {"ok": bool, "path" | "error": ...}``.  ``timeout`` bounds the whole close:
  a learner that does not confirm its final save by then (stopped, stuck on a slow disk) is
  reported as such (``final_save["timed_out"]``), and a child process is killed.
* ``abort(timeout)`` ends a learner whose bot failed to start: no final save (nothing may be
  written by a start that failed), its threads joined and its process reaped within ``timeout``.

:class:`LearnerLink` is the acting side's half that the thread and process learners share: the
bounded outgoing queue, the local weight snapshot that acting pulls from, and the pushed status.
Nothing here imports torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sacbot.config import Config
from sacbot.wire.channels import Channel
from sacbot.wire.messages import Message
from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot
from sacbot.wire.status import LearnerStatus

LEARNER_KINDS = ("thread", "process")


class StartError(RuntimeError):
    """The bot cannot start (no checkpoint to evaluate, a directory in use, ...): exit 1."""


class StartInterrupted(StartError):
    """A stop was requested while the bot was starting: nothing was saved, nothing is left running."""



@dataclass
class Start:
    """What a bot starts from: the actor it plays first, and the learner it feeds (None in eval).
    ``release`` frees what the start holds (the writer lock) at close; ``abort`` instead ends the
    learner unsaved and frees it, if the bot fails to start."""

    arrays: dict[str, np.ndarray]
    policy_version: int
    loaded_from: str | None
    learner: object | None = None  # a sacbot.wire.boundary.Learner
    env_steps: int = 0  # transitions the learner has already seen (learning_starts counts them)
    episodes: int = 0  # episodes of earlier runs: the next episode's index continues from here
    acting_rng: str | None = None  # the acting noise state saved by the last close
    release: Callable[[], None] = field(default=lambda: None)
    abort: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class LearnerSpec:
    """Everything a learner needs to build itself, as plain data (msgpack-able)."""

    config: dict  # Config.to_dict()
    obs_dim: int
    act_dim: int
    spaces: dict  # what the manifest records: dims, obs shape, action bounds
    metrics_path: str
    weights_dir: str
    latest_name: str = "sac_latest.zip"

    def cfg(self) -> Config:
        """The Config these plain settings came from."""
        return Config(**self.config)


class Learner(Protocol):
    """What the acting side holds of its learner: the contract in this module's docstring."""

    def send(self, msgs: list[Message]) -> int:
        """Queue messages for the learner; never blocks.  How many got a place (the rest are counted drops)."""
        ...

    def pull(self, version: int) -> tuple[int, dict[str, np.ndarray]] | None:
        """``(new_version, actor arrays)`` if the learner published a newer actor than ``version``, else None."""
        ...

    def status(self) -> LearnerStatus:
        """The status the learner last pushed."""
        ...

    def drops(self) -> dict[str, int]:
        """Messages dropped by a full queue, by kind."""
        ...

    def wait_processed(self, n: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until the learner has trained on the first ``n`` transitions (lockstep)."""
        ...

    def wait_caught_up(self, sent: int, slack: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until at most ``slack`` of the ``sent`` transitions wait for their updates (the learner pace)."""
        ...

    def close(self, acting_rng: str | None = None, timeout: float = 60.0) -> LearnerStatus:
        """Shutdown after the data: drain, final save, exit, within ``timeout``; the last status."""
        ...

    def abort(self, timeout: float) -> bool:
        """End without a final save (the bot failed to start); True once it is gone."""
        ...


# How often a wait that a stop request may end looks at it.  A signal handler that sets the stop
# event runs in the main thread while that thread waits here, but cannot wake the wait itself.
STOP_POLL_S = 0.05


def not_confirmed(timeout: float, what: str) -> dict:
    """The ``final_save`` of a close that ran out of time: ``what`` did not happen in ``timeout`` s."""
    return {"ok": False, "timed_out": True, "deadline_s": timeout,
            "error": f"the final save was not confirmed within the {timeout:g} s deadline ({what})"}


class LearnerLink:
    """Acting side of a learner: outgoing queue, local snapshot, pushed status.

    The learner side calls ``publish(arrays)`` and ``push_status(status)`` (from its thread, or
    from the thread that reads a child process's pipe); the acting side calls ``send``,
    ``pull``, ``status`` and ``wait_processed``."""

    def __init__(self, queue_size: int):
        self.outbox = Channel(queue_size)
        self.snapshot = WeightSnapshot()
        self._reader = SnapshotReader(self.snapshot)
        self._status = LearnerStatus()
        self._cond = threading.Condition()

    # --- learner side ---------------------------------------------------------------------
    def publish(self, arrays: dict[str, np.ndarray], version: int | None = None) -> int:
        """Make a new actor the one the acting side pulls next; its version."""
        return self.snapshot.publish(arrays, version)

    def push_status(self, status: LearnerStatus | dict) -> None:
        """A LearnerStatus replaces the status; a dict (a host's partial word, or a record that
        came over a pipe or Ray as plain data) is laid over it.  A new record each time: readers
        hold no lock while using it."""
        with self._cond:
            self._status = status if isinstance(status, LearnerStatus) else self._status.but(**status)
            self._cond.notify_all()

    # --- acting side ----------------------------------------------------------------------
    def send(self, msgs: list[Message]) -> int:
        """Queue messages for the learner; never blocks.  How many got a place."""
        ok = 0
        for m in msgs:
            if self.outbox.send(m):
                ok += 1
        return ok

    def pull(self, version: int) -> tuple[int, dict[str, np.ndarray]] | None:
        """``(new_version, arrays)`` if a newer actor than ``version`` was published, else None."""
        if self.snapshot.version == version:
            return None  # the common case: an int compare, no lock
        if not self._reader.pull():
            return None
        return self._reader.version, self._reader.arrays

    def status(self) -> LearnerStatus:
        """The status the learner last pushed (a frozen record: no lock is held while it is read)."""
        return self._status

    def drops(self) -> dict[str, int]:
        """Messages the full queue dropped, by kind."""
        return self.outbox.drops

    def wait_ready(self, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until the learner has built itself and published its first actor (or failed);
        False if ``stop`` was set first."""
        return self.wait_for(lambda st: self.snapshot.version > 0 or not st.learner_alive, timeout, stop)

    def wait_for(self, predicate, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until ``predicate(status)`` holds for the LearnerStatus (a test's or a tool's
        synchronisation), at most ``timeout`` s, and no longer than it takes to see ``stop`` set."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._status):
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return False
                self._cond.wait(left if stop is None else min(left, STOP_POLL_S))
            return True

    def wait_processed(self, n: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until the learner reports ``processed >= n``; False if it died, time ran out or
        ``stop`` was set."""
        return self.wait_for(lambda st: st.processed >= n or not st.learner_alive, timeout, stop) \
            and self._status.processed >= n

    def wait_caught_up(self, sent: int, slack: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until at most ``slack`` of the ``sent`` transitions still wait for their updates
        (the learner pace); False if the learner died, time ran out or ``stop`` was set."""
        return self.wait_processed(sent - slack, timeout, stop)
