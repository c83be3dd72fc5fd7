"""Liveness files: the round counter and the status.json heartbeat, for watchers outside the bot.

Both are written by the acting loop itself, atomically (temp file, then rename), so
a reader never sees a torn value and a stuck loop shows as a stale file.
"""

from __future__ import annotations

import json
import os
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


class Heartbeat:
    """Writes status.json at most once per ``interval`` seconds."""

    def __init__(self, path: str, interval: float = 1.0):
        self.path, self.interval = path, interval
        self._last = 0.0

    def maybe_write(self, make_status, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        try:
            _write(self.path, json.dumps(make_status(), indent=1, default=str), durable=False)
        except (OSError, TypeError, ValueError) as e:
            # A runner sees a stale heartbeat and acts; the bot must not die of it, but says why.
            write_failed(self.path, e, "the heartbeat")
            return False
        write_ok(self.path)
        return True


def read_status(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
