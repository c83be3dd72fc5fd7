"""Atomic file writes: a temp file beside the target, fsynced, then renamed over it.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import BinaryIO

from sacbot.store.format import TMP_PREFIX


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support directory fsync
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: str, text: str, encoding: str = "utf-8", durable: bool = True) -> None:
    """``atomic_write`` of ``text``; the directory must exist.  ``durable=False`` skips the fsyncs:
    still never torn for a reader, but a power cut may bring back the previous version."""
    data = text.encode(encoding)
    atomic_write(path, lambda fh: fh.write(data), durable=durable)


def temp_path(path: str) -> str:
    """The temp name ``atomic_write`` uses for ``path``: beside it, named for this process (so
    ``remove_stale_temps`` can tell a dead writer's temp from a live one's) and this thread (so
    two threads writing one target never share a temp)."""
    d = os.path.dirname(os.path.abspath(path))
    return os.path.join(d, f"{TMP_PREFIX}{os.getpid()}-{threading.get_native_id()}-{os.path.basename(path)}")


def atomic_write(path: str, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """THE atomic write, the only one in sacbot: ``write(fh)`` into a temp file in the same directory, flush,
    fsync, os.replace, fsync the directory: a crash leaves the old file or the new one, never a mix.
    ``durable=False`` leaves out both fsyncs (for the once-a-second heartbeat, written on the acting
    thread, where an fsync could stall a tick and an older heartbeat after a power cut is harmless)."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(d)
