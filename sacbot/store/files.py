"""Small file helpers shared by every side: one JSONL appender, and how a failed write is told.

    append_jsonl(path, {"episode": 3, "return": 1.5})   # open, append, close; False on failure
    write_failed(path, err, "the heartbeat")            # logged once per path and kind of error
    write_ok(path)                                      # after a failure: says the file works again

A bot never dies of a file it cannot write (a log line, its heartbeat, its round counter), but it
must not fall silent either: a runner that sees a frozen round counter, and a person reading the
bot's log, need the path and the error.  Each path and kind of error (ENOSPC, EACCES, EISDIR, a
value JSON cannot hold) is logged once, on the "sacbot" logger, not once per tick; once the path is
written again that is said too, and a later failure is logged again.

(Atomic writes, with fsync, live in :mod:`sacbot.store.checkpoint`: ``atomic_write``,
``atomic_write_bytes`` and ``atomic_write_text``.)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading

log = logging.getLogger("sacbot")
_failing: dict[str, set[str]] = {}  # path -> kinds of error already said
_lock = threading.Lock()


def error_kind(e: BaseException) -> str:
    """ENOSPC, EACCES, ... for an OSError with an errno; the exception's type otherwise."""
    code = getattr(e, "errno", None)
    return errno.errorcode.get(code, type(e).__name__) if isinstance(code, int) else type(e).__name__


def write_failed(path: str, e: BaseException, what: str = "") -> None:
    """Log that ``path`` (``what`` says which file it is) could not be written, once per path and
    kind of error."""
    kind = error_kind(e)
    with _lock:
        said = _failing.setdefault(path, set())
        if kind in said:
            return
        said.add(kind)
    log.warning("cannot write %s%r: %s: %s (said once for this file and error; sacbot goes on without it)",
                f"{what} " if what else "", path, type(e).__name__, e)


def write_ok(path: str) -> None:
    """After a failure of ``path``: say it is written again (the next failure is logged again)."""
    if path not in _failing:  # the usual case: one dict lookup per write
        return
    with _lock:
        if _failing.pop(path, None) is None:
            return
    log.info("%r is written again", path)


def append_jsonl(path: str, record: dict) -> bool:
    """Open, append one line, close.  A failure (full disk, bad value) is logged once (see above)
    and reported to the caller, never raised: a log line must never stop a bot."""
    try:
        line = json.dumps(record) + "\n"
        with open(path, "a") as fh:
            fh.write(line)
    except (OSError, TypeError, ValueError) as e:
        write_failed(path, e, "a line of")
        return False
    write_ok(path)
    return True


class UnusableDir(RuntimeError):
    """A directory a bot needs is not one (a file is in the way) or cannot be made."""


def make_dir(path: str, flag: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:  # a file in the way, no permission, a read-only disk
        why = "a file is in the way" if os.path.isfile(path) else e.strerror
        raise UnusableDir(f"{flag} {path!r} cannot be used as a directory: {why}") from None
