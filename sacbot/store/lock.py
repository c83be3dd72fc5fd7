"""One writer per weights directory, so two bots never race on one checkpoint: an OS lock on ``<dir>/.sacbot.lock``.

Usage::

    with WriterLock(cfg.weights_path):        # raises LockHeld when another process has it
        remove_stale_temps(cfg.weights_path)  # safe now: no other sacbot writes here
        ...                                   # train, save, rotate

``fcntl.flock`` is held by the open file, so the OS releases it when the holder exits in any way,
``kill -9`` included: a dead writer never leaves a stale lock to clean up.  The file holds the
PID of the process that took the lock, for the error message only; the lock itself is the flock.
The file is never deleted: deleting it while another process waits to lock the old inode would
let two writers in at once.

The lock never crosses a fork or an exec.  The descriptor is opened close-on-exec, so a runner's
or a tool's subprocess never holds its parent's lock; and a child made by ``fork`` without
``exec`` (a game's ``multiprocessing`` pool) closes its copy at once (``os.register_at_fork``).
That copy would otherwise share the open file, and with it the flock: the parent's close would
release nothing, and the next start would be refused while the parent was long gone.

Where ``fcntl`` does not exist (Windows) the lock is ``msvcrt.locking`` on one byte of the same file,
which the OS also frees when its holder exits; Windows forks nothing, and the PID in the file is
taken at its word.  A platform with neither lock gets an error naming it, not an unguarded directory.

Who holds a lock that cannot be taken is read from the system where it can be (Linux lists each
descriptor's locks in ``/proc/<pid>/fdinfo``), not only from the PID in the file: a process that
was handed the descriptor (``pass_fds``) holds the lock without having written its PID there.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

LOCK_NAME = ".sacbot.lock"


class LockHeld(RuntimeError):
    """Another process holds the directory's writer lock; the message names its PID.  ``pid`` is
    the holder's (None when it cannot be told); ``recorded`` is the PID the lock file names."""

    def __init__(self, directory: str, pid: int | None, recorded: int | None = None):
        self.directory, self.pid, self.recorded = directory, pid, recorded
        if pid == os.getpid():  # flock is per open file: a second Agent in one process is refused too
            who = "another Agent (or learner) in this same process"
        elif pid is not None:
            who = f"process {pid}"
        elif recorded is not None:
            who = (f"another process (the lock file names process {recorded}, which no longer holds it: a "
                   "process it started may)")
        else:
            who = "another process (its PID is not recorded yet)"
        super().__init__(f"weights directory {directory!r} is in use by {who}, another sacbot writer; "
                         "two writers would overwrite each other's checkpoints. Stop that process, or "
                         "pass another --weights-path")


# The locks this process holds (writer locks and run-directory claims): a forked child closes its
# copies (see the module's docstring).
_HELD: set[HeldFile] = set()


def _close_in_child() -> None:
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            try:
                os.close(fd)  # only the child's copy: the parent's open file keeps the flock
            except OSError:
                pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_close_in_child)


def _os_lock() -> str:
    """Which OS lock this platform has: ``"flock"`` (POSIX ``fcntl``) or ``"msvcrt"`` (Windows).
    Asked at each lock, not at import: the module loads on either."""
    try:
        import fcntl  # noqa: F401
        return "flock"
    except ImportError:
        pass
    try:
        import msvcrt  # noqa: F401
        return "msvcrt"
    except ImportError:
        raise OSError(errno.ENOTSUP, "this platform has neither fcntl.flock (POSIX) nor msvcrt.locking (Windows), "
                      "so sacbot cannot keep a second writer out of a weights or run directory; run on Linux, macOS "
                      "or Windows") from None


# Windows' locks are mandatory: a locked byte cannot be read by another process.  So the lock is on
# one byte far past the record (files may be locked past their end), and a refused starter can still
# read who holds it.
_MSVCRT_BYTE = 1 << 24


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd``'s file without waiting: True if taken, False if another
    open file holds it."""
    if _os_lock() == "flock":
        import fcntl
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    import msvcrt
    os.lseek(fd, _MSVCRT_BYTE, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
    except OSError as e:
        if e.errno in (errno.EACCES, getattr(errno, "EDEADLOCK", errno.EDEADLK)):
            return False
        raise
    return True


def free_lock(fd: int) -> None:
    """Release the lock taken on ``fd`` and close it.  A flock goes with the close; Windows frees a
    closed file's locks only "when resources allow", so the byte is unlocked first."""
    try:
        if _os_lock() == "msvcrt":
            import msvcrt
            os.lseek(fd, _MSVCRT_BYTE, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
    except OSError:
        pass  # the close below frees it anyway
    finally:
        os.close(fd)


def read_record(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from the start of the lock file (the holder's record).  Seek and read,
    not ``os.pread``: Windows has none."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit)


def take_os_lock(path: str, record: bytes, held: Callable[[int], BaseException]) -> int:
    """Open ``path`` (made if missing), take an exclusive OS lock on it without waiting (``flock``;
    ``msvcrt.locking`` on Windows), and write ``record`` into it for messages; the open fd, whose
    ``free_lock`` (or the process's end, ``kill -9`` included) frees the lock.  If another process
    holds it: ``held(fd)`` (which may read its record) is raised, the fd closed.  Any other OSError
    passes through, as does a platform with neither lock."""
    _os_lock()  # a platform with no lock at all is told so before a file is made
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        taken = _try_lock(fd)
        if not taken:
            err = held(fd)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        raise err
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, record)
    except OSError:
        pass  # the record is only for messages; the OS lock is the lock
    return fd


class HeldFile:
    """A file this process holds an OS lock on, from ``_take`` to ``_free`` (or its exit); what a
    writer lock and a run-directory claim share.  A forked child closes its copy at once."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds it now."""
        return self._fd is not None

    def _take(self, record: bytes, held: Callable[[int], BaseException]) -> None:
        if self._fd is None:
            self._fd = take_os_lock(self.path, record, held)
            _HELD.add(self)

    def _free(self) -> None:
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is not None:
            free_lock(fd)


class WriterLock(HeldFile):
    """A non-blocking exclusive lock on a directory, held until ``close()`` or process exit."""

    def __init__(self, directory: str):
        super().__init__(os.path.join(directory, LOCK_NAME))
        self.directory = directory

    def acquire(self) -> WriterLock:
        """Take the lock or raise ``LockHeld`` at once (never waits).  The directory must exist;
        an OSError (read-only directory, ...) passes through."""

        def held(fd: int) -> LockHeld:
            recorded = _read_pid(fd)
            return LockHeld(self.directory, _holder(fd, recorded), recorded)

        self._take(f"{os.getpid()}\n".encode(), held)
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
        self._free()

    release = close

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.close()


def _read_pid(fd: int) -> int | None:
    try:
        text = read_record(fd, 32).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _holder(fd: int, recorded: int | None) -> int | None:
    """The PID of a process holding the flock on ``fd``'s file: the recorded one if the system
    confirms it, else one the system shows holding it.  Where the system cannot be asked (no
    /proc, another user's processes), the recorded PID if that process runs; else None.  Under
    Windows' lock the file's word is taken: /proc does not exist, and ``os.kill(pid, 0)`` there
    would end the process rather than ask after it."""
    if _os_lock() == "msvcrt":
        return recorded
    try:
        st = os.fstat(fd)
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return recorded if recorded is not None and _runs(recorded) else None
    key = (st.st_dev, st.st_ino)
    checked = False
    if recorded is not None:
        found = _holds(recorded, key)
        if found:
            return recorded
        checked = found is not None
    holders = [p for p in sorted(pids) if p != recorded and _holds(p, key)]
    if holders:
        return holders[0]
    if recorded is not None and not checked and _runs(recorded):
        return recorded  # its descriptors could not be read: take the file's word
    return None


def _holds(pid: int, key: tuple[int, int]) -> bool | None:
    """Whether process ``pid`` has a descriptor on the file ``key`` (st_dev, st_ino) that holds a
    flock (its ``/proc/<pid>/fdinfo`` lists a lock); None where its descriptors cannot be read."""
    base = f"/proc/{pid}"
    try:
        fds = os.listdir(f"{base}/fd")
    except OSError:
        return None
    for n in fds:
        try:
            st = os.stat(f"{base}/fd/{n}")
            if (st.st_dev, st.st_ino) != key:
                continue
            with open(f"{base}/fdinfo/{n}") as fh:
                if any(line.startswith("lock:") and "FLOCK" in line for line in fh):
                    return True
        except OSError:
            continue  # closed meanwhile, or not ours to read
    return False


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True
