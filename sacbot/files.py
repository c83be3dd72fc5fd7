"""Small file helpers shared by every side: one JSONL appender.

    append_jsonl(path, {"episode": 3, "return": 1.5})   # open, append, close; False on failure

(Atomic writes, with fsync, live in :mod:`sacbot.checkpoint`: ``atomic_write``,
``atomic_write_bytes`` and ``atomic_write_text``.)
"""

from __future__ import annotations

import json


def append_jsonl(path: str, record: dict) -> bool:
    """Open, append one line, close.  A failure (full disk, bad value) is reported to the
    caller, never raised: a log line must never stop a bot."""
    try:
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        return True
    except (OSError, TypeError, ValueError):
        return False
