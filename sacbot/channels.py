"""Bounded channels between threads: sends never block, drops are counted per kind.

Usage (acting side sends, training side receives)::

    ch = Channel(capacity=256)
    ch.send(transition)                 # never blocks; if full the message is dropped
    msg = ch.recv(timeout=0.1)          # blocks up to timeout; None when nothing came
    rest = ch.drain()                   # everything already queued, without blocking
    ch.drops                            # {"transition": n, "other": m}

Dropping the *newest* message on overflow keeps what is queued in order and costs
the acting thread nothing but a counter increment.
"""

from __future__ import annotations

import queue
import threading

from .messages import Transition


class Channel:
    def __init__(self, capacity: int):
        self._q: queue.Queue = queue.Queue(maxsize=capacity)
        self._lock = threading.Lock()
        self._drops = {"transition": 0, "other": 0}
        self.capacity = capacity

    def send(self, msg) -> bool:
        """Queue ``msg`` if there is room; otherwise drop it and count.  Never blocks."""
        try:
            self._q.put_nowait(msg)
            return True
        except queue.Full:
            with self._lock:
                self._drops["transition" if isinstance(msg, Transition) else "other"] += 1
            return False

    def recv(self, timeout: float):
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def qsize(self) -> int:
        return self._q.qsize()

    @property
    def drops(self) -> dict[str, int]:
        with self._lock:
            return dict(self._drops)


class SaveSlot:
    """The I/O queue: one slot.  Periodic offers are dropped (and counted) while the
    writer is busy; ``put_final`` waits for room, so the final save is never lost."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue(maxsize=1)
        self.dropped = 0
        # {replay chunk index: generation} the writer holds encoded; the writer replaces the
        # whole dict (never mutates it), so the training thread may read it without a lock.
        self.held: dict[int, int] = {}

    def has_room(self) -> bool:
        return not self._q.full()

    def offer(self, item) -> bool:
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def put_final(self, item, timeout: float | None = None) -> None:
        self._q.put(item, timeout=timeout)

    def get(self, timeout: float):
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def task_done(self) -> None:
        self._q.task_done()

    def join(self) -> None:
        self._q.join()
