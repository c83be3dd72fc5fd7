"""Liveness files: the round counter and the status.json heartbeat, for watchers outside the bot.

Both are written atomically (temp file, then rename), so a reader never sees a torn value.  The
round counter is written by the acting loop itself, with fsync, once per episode.  The heartbeat's
content is made by the acting loop (a stuck loop makes none, and shows as a stale file) and
written by one thread of the process, ``sacbot-heartbeat``: a rename costs 0.2-1.2 ms, and a
server's loop acting for 32 games would otherwise pay 32 of them a second between its steps.
"""

from __future__ import annotations

import json
import os
import threading
import time

from sacbot.store.atomic import atomic_write_text
from sacbot.store.files import write_failed, write_ok


def _write(path: str, text: str, durable: bool) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, text, durable=durable)


class RoundCounter:
    """One integer in a file; bumped once per finished episode; continues after restart."""

    def __init__(self, path: str):
        self.path = path
        self.value = read_round_counter(path) or 0

    def bump(self) -> int:
        self.value += 1
        try:
            _write(self.path, f"{self.value}\n", durable=True)  # it must continue after a restart
        except OSError as e:
            # A runner sees a stale counter and acts; the bot must not die of it, but says why.
            write_failed(self.path, e, "the round counter")
        else:
            write_ok(self.path)
        return self.value


def read_round_counter(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


class _Writer:
    """The process's heartbeat writer: the newest text for each path, written in order on one thread.

    ``put`` never waits; a text not yet written when a newer one for its path comes is dropped (a
    heartbeat is a latest value).  ``wait`` waits, with a timeout, until a path's latest text is
    written (or failed): a bot's last heartbeat, at its close, is on disk when close returns."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[str, str] = {}  # path -> newest text not yet taken by the thread
        self._writing: str | None = None  # the path the thread is writing now
        self._thread: threading.Thread | None = None  # running while there is work; ends when idle

    def put(self, path: str, text: str) -> None:
        with self._cond:
            self._pending[path] = text
            if self._thread is None:
                # A daemon: a heartbeat is never worth holding the interpreter's exit for.
                self._thread = threading.Thread(target=self._run, name="sacbot-heartbeat", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, path: str, timeout: float) -> bool:
        """True once neither a text for ``path`` is pending nor being written; False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: path not in self._pending and self._writing != path, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._pending, timeout=WRITER_IDLE_S):
                    self._thread = None  # the next put starts another
                    return
                path = next(iter(self._pending))
                text = self._pending.pop(path)
                self._writing = path
            try:
                _write(path, text, durable=False)
            except OSError as e:
                # A runner sees a stale heartbeat and acts; the bot must not die of it, but says why.
                write_failed(path, e, "the heartbeat")
            else:
                write_ok(path)
            finally:
                with self._cond:
                    self._writing = None
                    self._cond.notify_all()

    def reset_in_child(self) -> None:
        # A forked child has the parent's pending texts and lock state but not its thread.
        self._cond = threading.Condition()
        self._pending, self._writing, self._thread = {}, None, None


WRITER_IDLE_S = 5.0  # the writer's thread ends after this long with nothing to write
_writer = _Writer()
if hasattr(os, "register_at_fork"):  # POSIX; Windows forks nothing
    os.register_at_fork(after_in_child=_writer.reset_in_child)
FORCED_WRITE_TIMEOUT_S = 5.0  # a forced heartbeat's wait for a disk that hangs


def flush_heartbeats(path: str, timeout: float = FORCED_WRITE_TIMEOUT_S) -> bool:
    """Wait until ``path``'s newest heartbeat is written (or has failed, and been logged)."""
    return _writer.wait(path, timeout)


class Heartbeat:
    """status.json, at most once per ``interval`` seconds: made by the caller, written by ``sacbot-heartbeat``."""

    def __init__(self, path: str, interval: float = 1.0):
        self.path, self.interval = path, interval
        self._last = 0.0

    def maybe_write(self, make_status, force: bool = False) -> bool:
        """Hand a new status to the writer if ``interval`` has passed (or ``force``); never waits,
        except with ``force``, which returns once it is written (False if that took over 5 s)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        try:
            text = json.dumps(make_status(), indent=1, default=str)
        except (TypeError, ValueError) as e:
            write_failed(self.path, e, "the heartbeat")
            return False
        _writer.put(self.path, text)
        return flush_heartbeats(self.path) if force else True


def read_status(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
