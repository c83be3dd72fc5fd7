"""The learner boundary (SPEC 14): how a bot talks to its learner, in plain messages only.

A bot holds one :class:`Learner` and nothing else of the learning side.  Whether the learner is a
thread in this process (:mod:`sacbot.thread_learner`), a child process
(:mod:`sacbot.process_learner`) or a Ray actor that many bots feed, the acting loop is the same::

    learner = start_learner(...)                 # built by sacbot.assemble, never by the Agent
    version, params = 0, None
    while playing:
        got = learner.pull(version)              # newest actor, only if newer than ``version``
        if got is not None:
            version, arrays = got                # plain numpy arrays (the deployable actor)
            params = policy.build_params(arrays)
        action = policy.act(params, obs, state)  # numpy; never waits on the learner
        learner.send([Transition(...)])          # never blocks: a full queue drops and counts
        learner.status()                         # the plain dict the learner last pushed
    final = learner.close(acting_rng)            # Shutdown after the data: drain, final save, exit

The contract:

* ``send(msgs)`` takes :mod:`sacbot.messages` objects (plain data; each has a msgpack wire form)
  and never blocks.  Transitions that find the queue full are dropped and counted in
  ``drops()``; control messages (``NewEpisode``) have reserved room (see :class:`Channel`).
* ``pull(version)`` returns ``(new_version, arrays)`` when the learner has published a newer
  actor, else None.  The arrays belong to the caller until its next pull.
* ``status()`` returns the learner's last pushed status: counters, losses, device, errors.  It is
  computed by the learner from its own objects; the acting side never touches them.
* ``wait_processed(n, timeout)`` blocks until the learner has trained on the first ``n``
  transitions (lockstep pace only; never called from a real-time loop).
* ``close(acting_rng)`` sends ``Shutdown`` after the data.  The learner moves what is queued into
  its buffer without training on it, makes the final save (blocking, guaranteed unless the
  learner's state is not finite), stops its writer and exits; ``close`` returns its final status
  with ``final_save = {"ok": bool, "path" | "error": ...}``.

:class:`LearnerLink` is the acting side's half that the thread and process learners share: the
bounded outgoing queue, the local weight snapshot that acting pulls from, and the pushed status.
Nothing here imports torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .channels import Channel
from .config import Config
from .messages import Message
from .snapshot import SnapshotReader, WeightSnapshot

LEARNER_KINDS = ("thread", "process")


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
        return Config(**self.config)


class Learner(Protocol):
    def send(self, msgs: list[Message]) -> int: ...
    def pull(self, version: int) -> tuple[int, dict[str, np.ndarray]] | None: ...
    def status(self) -> dict: ...
    def drops(self) -> dict[str, int]: ...
    def wait_processed(self, n: int, timeout: float) -> bool: ...
    def close(self, acting_rng: str | None = None, timeout: float = 60.0) -> dict: ...


class LearnerLink:
    """Acting side of a learner: outgoing queue, local snapshot, pushed status.

    The learner side calls ``publish(arrays)`` and ``push_status(dict)`` (from its thread, or
    from the thread that reads a child process's pipe); the acting side calls ``send``,
    ``pull``, ``status`` and ``wait_processed``."""

    def __init__(self, queue_size: int):
        self.outbox = Channel(queue_size)
        self.snapshot = WeightSnapshot()
        self._reader = SnapshotReader(self.snapshot)
        self._status: dict = {"learner_alive": True, "processed": 0}
        self._cond = threading.Condition()

    # --- learner side ---------------------------------------------------------------------
    def publish(self, arrays: dict[str, np.ndarray], version: int | None = None) -> int:
        return self.snapshot.publish(arrays, version)

    def push_status(self, status: dict) -> None:
        """Replace the status (a new dict each time: readers hold no lock while using it)."""
        with self._cond:
            self._status = {**self._status, **status}
            self._cond.notify_all()

    # --- acting side ----------------------------------------------------------------------
    def send(self, msgs: list[Message]) -> int:
        ok = 0
        for m in msgs:
            if self.outbox.send(m):
                ok += 1
        return ok

    def pull(self, version: int) -> tuple[int, dict[str, np.ndarray]] | None:
        if self.snapshot.version == version:
            return None  # the common case: an int compare, no lock
        if not self._reader.pull():
            return None
        return self._reader.version, self._reader.arrays

    def status(self) -> dict:
        return self._status

    def drops(self) -> dict[str, int]:
        return self.outbox.drops

    def wait_ready(self, timeout: float) -> bool:
        """Block until the learner has built itself and published its first actor (or failed)."""
        return self.wait_for(lambda st: self.snapshot.version > 0 or not st.get("learner_alive", True), timeout)

    def wait_for(self, predicate, timeout: float) -> bool:
        """Block until ``predicate(status)`` holds (a test's or a tool's synchronisation)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._status), timeout)

    def wait_processed(self, n: int, timeout: float) -> bool:
        """Block until the learner reports ``processed >= n``; False if it died or time ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._status.get("processed", 0) >= n
                                       or not self._status.get("learner_alive", True), timeout) \
                and self._status.get("processed", 0) >= n
