"""Bounded channels between threads: sends never block, drops are counted per kind.

Usage (acting side sends, training side receives)::

    ch = Channel(capacity=256)
    ch.send(transition)                 # never blocks; if full the message is dropped
    msg = ch.recv(timeout=0.1)          # blocks up to timeout; None when nothing came
    rest = ch.drain()                   # everything already queued, without blocking
    ch.drops                            # {"transition": n, "other": m}

Dropping the *newest* message on overflow keeps what is queued in order and costs
the acting thread nothing but a counter increment.  Only transitions are dropped: control
messages (NewEpisode, Shutdown) have ``reserve`` places of their own beyond ``capacity``, since
a lost NewEpisode would chain two episodes in the replay or skip an opponent change's clear.
A gap marker (``NewEpisode(gap=True)``, sent after dropped transitions) is the exception: it takes
a place of ``capacity`` like a transition, so that markers from many bots sharing one queue
never use up the episode starts' reserve.  A refused marker is not counted: it carries no data,
and the sender counts the transition behind it as dropped.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from sacbot.wire.messages import NewEpisode, Transition, Transitions


def transitions_in(msg) -> int:
    """How many transitions ``msg`` (or a many-bot learner's ``(source, msg)``) carries."""
    m = msg[1] if isinstance(msg, tuple) else msg
    if isinstance(m, Transition):
        return 1
    return len(m) if isinstance(m, Transitions) else 0


def is_gap_marker(msg) -> bool:
    """``msg`` (or ``(source, msg)``) is a gap marker: ``NewEpisode(gap=True)``."""
    m = msg[1] if isinstance(msg, tuple) else msg
    return isinstance(m, NewEpisode) and m.gap


def places_in(msg) -> int:
    """How many places of a channel's ``capacity`` ``msg`` takes: its transitions, or one for a gap marker."""
    return 1 if is_gap_marker(msg) else transitions_in(msg)


class Chain:
    """One bot's episode as it goes into a queue that drops: after a transition was lost, the next
    one goes after a gap marker, so that the replay starts a new chain there and no sampled
    sequence steps over the missing ticks.  One marker covers every loss until a transition gets
    in after it, so a full queue is not flooded with markers.  A new Chain per episode start.

        chain = Chain(NewEpisode(opponent, gap=True))   # after the episode's start went in
        got = chain.send(put, transition)   # put(msg) -> bool queues one message, never blocks
        # True: queued; False: the queue dropped it; None: not offered (no place for its marker)
    """

    __slots__ = ("marker", "gap", "chained")

    def __init__(self, marker: NewEpisode):
        self.marker = marker
        self.gap = False  # the next transition needs a marker first
        self.chained = False  # a transition got in since the chain's start: a loss now is a gap

    def lost(self) -> None:
        """What came before the next transition is lost (not by this Chain's own sends)."""
        self.gap = True

    def send(self, put: Callable[[object], bool], msg) -> bool | None:
        if self.gap:
            if not put(self.marker):
                return None
            self.gap = self.chained = False
        if put(msg):
            self.chained = True
            return True
        self.gap = self.chained
        return False


class Channel:
    def __init__(self, capacity: int, reserve: int = 64):
        # One episode start per episode: 64 places outlast any learner pause that the
        # transitions' own capacity does not already swallow.
        self._q: queue.Queue = queue.Queue(maxsize=capacity + reserve)
        self._lock = threading.Lock()
        self._drops = {"transition": 0, "other": 0}
        self._held = 0  # places of capacity taken (transitions, gap markers), not queue items
        self.capacity = capacity

    def send(self, msg, control_wait: float = 0.0) -> bool:
        """Queue ``msg`` if there is room; otherwise drop it and count.  A transition never
        blocks and is dropped once ``capacity`` transitions are queued (a :class:`Transitions`
        block counts as its length and goes in or out whole; one larger than ``capacity`` only
        into an empty channel).  A control message takes a
        reserved place; if the learner has let even those fill up, it is dropped and counted (the
        acting thread never waits), unless the caller allows ``control_wait`` s (a close's
        Shutdown does)."""
        n = places_in(msg)
        try:
            if n:
                with self._lock:
                    # A block larger than the whole capacity goes into an empty channel: else it
                    # could never go in (memory stays bounded by the larger of the two).
                    if self._held + n > self.capacity and self._held:
                        raise queue.Full
                    self._held += n
                try:
                    self._q.put_nowait(msg)
                except queue.Full:  # control messages took the reserve and more: give the places back
                    with self._lock:
                        self._held -= n
                    raise
            elif control_wait > 0:
                self._q.put(msg, timeout=control_wait)
            else:
                self._q.put_nowait(msg)
            return True
        except queue.Full:
            if not is_gap_marker(msg):  # a marker holds no data: its sender counts the transition behind it
                t = transitions_in(msg)
                with self._lock:
                    self._drops["transition" if t else "other"] += max(t, 1)
            return False

    def recv(self, timeout: float):
        try:
            msg = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        self._release([msg])
        return msg

    def drain(self) -> list:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                break
        self._release(out)
        return out

    def _release(self, msgs: list) -> None:
        n = sum(places_in(m) for m in msgs)
        if n:
            with self._lock:
                self._held -= n

    def __len__(self) -> int:
        """Places of ``capacity`` taken: transitions queued (a block counts as its length) and gap markers."""
        return self._held

    @property
    def drops(self) -> dict[str, int]:
        with self._lock:
            return dict(self._drops)


class SaveSlot:
    """The I/O queue: one slot.  Periodic offers are dropped (and counted) while the
    writer is busy; ``put_final`` waits for room, so the final save is never lost."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue(maxsize=1)

    def has_room(self) -> bool:
        return not self._q.full()

    def offer(self, item) -> bool:
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            return False  # the caller counts it (TrainingState.save_offers_dropped)

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
