"""One writer per weights directory (issue 14): an OS lock on ``<dir>/.sacbot.lock``.

Usage::

    with WriterLock(cfg.weights_path):        # raises LockHeld when another process has it
        remove_stale_temps(cfg.weights_path)  # safe now: no other sacbot writes here
        ...                                   # train, save, rotate

``fcntl.flock`` is held by the open file, so the OS releases it when the holder exits in any way,
``kill -9`` included: a dead writer never leaves a stale lock to clean up.  The file holds the
holder's PID, for the error message only; the lock itself is the flock.  The file is never deleted:
deleting it while another process waits to lock the old inode would let two writers in at once.

The descriptor is not inherited across ``exec`` (Python's default), so a runner's or a tool's
subprocess never holds its parent's lock.  A child made by ``fork`` without ``exec`` would share it;
sacbot's process learner uses ``spawn``.
"""

from __future__ import annotations

import fcntl
import os
import time

LOCK_NAME = ".sacbot.lock"


class LockHeld(RuntimeError):
    """Another process holds the directory's writer lock; the message names its PID."""

    def __init__(self, directory: str, pid: int | None):
        self.directory, self.pid = directory, pid
        if pid == os.getpid():  # flock is per open file: a second Agent in one process is refused too
            who = "another Agent (or learner) in this same process"
        else:
            who = f"process {pid}" if pid is not None else "another process (its PID is not recorded yet)"
        super().__init__(f"weights directory {directory!r} is in use by {who}, another sacbot writer; "
                         "two writers would overwrite each other's checkpoints. Stop that process, or "
                         "pass another --weights-path")


class WriterLock:
    """A non-blocking exclusive lock on a directory, held until ``close()`` or process exit."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, LOCK_NAME)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> WriterLock:
        """Take the lock or raise ``LockHeld`` at once (never waits).  The directory must exist;
        an OSError (read-only directory, ...) passes through."""
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise LockHeld(self.directory, pid) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the PID is only for messages; the flock is the lock
        self._fd = fd
        return self

    def acquire_within(self, timeout: float) -> WriterLock:
        """``acquire``, retried for up to ``timeout`` s: a learner restarted after its process was
        killed, or a child that its parent just handed the directory to, waits for the OS to free
        the lock (flock has no timed wait; a retry every 50 ms costs nothing)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.acquire()
            except LockHeld:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        """Release the lock (closing the file releases the flock); the file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    release = close

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.close()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None

