"""A bot's own files in its weights directory: step names, rotation, receipts, stale temps.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import glob
import os
import re
import time

from sacbot.config import STEP_RE
from sacbot.store.errors import CheckpointError, CheckpointUnreadable
from sacbot.store.files import append_jsonl
from sacbot.store.format import LATEST, TMP_PREFIX, TMP_RE
from sacbot.store.read import _what_to_do, read_checkpoint

# --- a bot's own files ------------------------------------------------------------------------
RECEIPTS = "saves.jsonl"
_OWNED_STEP_RE = re.compile(r"\.step_\d+\.zip$", re.IGNORECASE)


def _stem(latest_name: str) -> str:
    return latest_name[:-4] if latest_name.lower().endswith(".zip") else latest_name


def step_name(latest_name: str, step: int) -> str:
    """The step file of ``step`` for the bot whose newest checkpoint is ``latest_name``:
    ``sac_step_<N>.zip`` for ``sac_latest.zip`` (the layout every older sacbot wrote), else
    ``<name>.step_<N>.zip``, so bots kept side by side in one folder never share a step file."""
    return f"sac_step_{step}.zip" if latest_name == LATEST else f"{_stem(latest_name)}.step_{step}.zip"


def _step_re(latest_name: str) -> re.Pattern:
    if latest_name == LATEST:
        return STEP_RE
    # Anchored on the whole stem: a.zip's a.step_5.zip is not aa.zip's, nor is aa.step_5.zip a's.
    return re.compile(r"^" + re.escape(_stem(latest_name)) + r"\.step_(\d+)\.zip$")


def receipts_name(latest_name: str = LATEST) -> str:
    """The save receipts of the bot whose newest checkpoint is ``latest_name``."""
    return RECEIPTS if latest_name == LATEST else f"{_stem(latest_name)}.{RECEIPTS}"


def check_latest_name(latest_name: str) -> None:
    """Refuse a newest-checkpoint name that is some bot's step file: every save of one of the two
    would overwrite the other's file."""
    if STEP_RE.match(latest_name) or _OWNED_STEP_RE.search(latest_name):
        other = re.sub(r"[._]step_(\d+)", r"-from-step-\1", _stem(latest_name), flags=re.IGNORECASE)
        raise ValueError(f"{latest_name!r} is the name of a step checkpoint (sac_step_<N>.zip, or <name>.step_<N>.zip "
                         "of the bot <name>.zip), which saves overwrite; name the bot's file otherwise, e.g. "
                         f"{other}.zip")


def step_files(directory: str, latest_name: str = LATEST) -> list[tuple[int, str]]:
    """(step, path) of the step files of the bot whose newest checkpoint is ``latest_name``, oldest
    first; another bot's in the same folder are not listed.  Raises ``CheckpointUnreadable`` when the
    folder exists but cannot be listed."""
    pattern = _step_re(latest_name)
    try:
        names = os.listdir(directory) if os.path.isdir(directory) else []
    except OSError as e:
        raise CheckpointUnreadable(f"{directory}: cannot list the folder ({os.strerror(e.errno) if e.errno else e}); "
                                   f"{_what_to_do(e.errno)}") from None
    out = []
    for name in names:
        m = pattern.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(out)


def _verifies(path: str) -> bool:
    try:
        read_checkpoint(path)
        return True
    except CheckpointError:
        return False


def rotate(directory: str, keep_last: int, verified: tuple[str, ...] = (), latest_name: str = LATEST) -> list[str]:
    """Delete the step files of the bot ``latest_name`` beyond the newest ``keep_last``, but never
    the newest one that passes full verification (otherwise a run of saves with NaN weights would
    rotate the last good file away).  Files are verified newest first and only until one passes; ``verified`` names
    files known good (the one just written).  Another bot's step files are never touched.
    Returns the deleted paths."""
    files = [p for _, p in step_files(directory, latest_name)]
    doomed = files[: max(0, len(files) - keep_last)]
    if not doomed:
        return []
    good = next((p for p in reversed(files) if p in verified or _verifies(p)), None)
    return _unlink_all(p for p in doomed if p != good)


def _unlink_all(paths) -> list[str]:
    """Delete each file it can; the ones deleted (one that cannot be is left for a later pass)."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except (OverflowError, ValueError):
        return False  # not a PID any process can have
    return True


def remove_stale_temps(directory: str) -> list[str]:
    """Delete temp files that crashed writers left: only sacbot's own (by name), and only those of
    writers no longer alive (the PID in the name, checked with ``os.kill(pid, 0)``); never this
    process's own.  A dead writer's PID that the OS has since given to a live process keeps its
    temp until a later cleanup: a leak of one file, never a live writer's file lost.

    Call it only while holding the directory's ``sacbot.store.lock.WriterLock``: the lock makes this
    process the directory's one writer, and the PID check covers anything else that writes there."""
    temps = glob.glob(os.path.join(glob.escape(directory), TMP_PREFIX + "*"))
    return _unlink_all(p for p in temps if not ((m := TMP_RE.match(os.path.basename(p))) and _alive(int(m.group(1)))))


def append_receipt(directory: str, record: dict, latest_name: str = LATEST) -> None:
    """One line of the bot's receipts (``receipts_name``: saves.jsonl for sac_latest.zip); a failure
    never turns a good save into a failure."""
    append_jsonl(os.path.join(directory, receipts_name(latest_name)), record)



def set_aside(path: str) -> str:
    """Rename a bad file to <name>.corrupt-<timestamp>; never delete or overwrite."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dst = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.exists(dst):
        dst = f"{path}.corrupt-{stamp}-{n}"
        n += 1
    os.replace(path, dst)
    return dst


def candidates(directory: str, latest_name: str = LATEST) -> list[str]:
    """Files to try, in order: the bot's newest checkpoint (``latest_name``), then its own step files,
    newest first (only when the newest is missing or proven corrupt).  Another bot's files in the
    same folder are never listed."""
    steps = [p for _, p in step_files(directory, latest_name)[::-1]]
    latest = os.path.join(directory, latest_name)
    return ([latest] if os.path.exists(latest) else []) + steps
