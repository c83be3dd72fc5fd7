"""Helpers shared by the tests."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time


class StderrWatcher:
    """Reads a child's stderr on a thread; ``wait_line`` blocks on a queue until a line
    containing ``needle`` arrives, with a hard deadline.  The child's own message is the
    synchronisation, not a sleep."""

    def __init__(self, proc):
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self._t = threading.Thread(target=self._read, args=(proc.stderr,), name="test-stderr", daemon=True)
        self._t.start()

    def _read(self, fh):
        for line in fh:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no stderr line with {needle!r}; got {''.join(self.seen)[-2000:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"child exited before {needle!r}: {''.join(self.seen)[-2000:]}")
            self.seen.append(line)
            if needle in line:
                return line

    def rest(self, timeout):
        self._t.join(timeout)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


def dir_digests(d) -> dict[str, str]:
    """sha256 of every file in a directory, by name: to show that a step changed no file."""
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in sorted(os.listdir(d))}
