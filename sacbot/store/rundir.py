"""One bot per run directory: an OS lock on ``<run_dir>/.sacbot.run``, naming its holder.

    claim = RunDirClaim(cfg.run_dir, cfg.weights_path).acquire()   # RunDirInUse if another bot has it
    ...                                                              # status.json, episodes, metrics
    claim.release()

A run directory holds one bot's ``status.json``, ``episodes.jsonl`` and (sacbot's layout)
``training_metrics.jsonl``.  Two bots given one (only ``--weights-path`` differing) interleaved
their metrics, so that steps went backwards, their episodes could not be told apart, and
``status.json`` was whichever wrote last: a dead bot showed as live.  So the Agent claims its run
directory at start, in the CLI and the Python API alike, eval included (it writes ``status.json``
too), and a second bot is refused with the first one's PID and weights path.

As with the weights directory's lock (sacbot/store/lock.py): ``fcntl.flock`` belongs to the open file, so
the OS frees it on any exit, ``kill -9`` included; the file is never deleted (a waiter on the old
inode and a new holder would both get in).  The file holds the holder's PID and weights path as
JSON, for messages only.  The descriptor is close-on-exec, and a child made by ``fork`` closes its
copy at once: otherwise the child would keep the flock after its parent had released it.
"""

from __future__ import annotations

import json
import os

from sacbot.store.lock import HeldFile, read_record

CLAIM_NAME = ".sacbot.run"


class RunDirInUse(RuntimeError):
    """Another bot holds the run directory.  ``pid`` and ``weights_path`` are the holder's (None
    when not recorded yet); ``same_bot`` says its weights path is this one's (the same bot started
    twice, or its last run still closing) rather than another bot's."""

    def __init__(self, run_dir: str, pid: int | None, weights_path: str | None, mine: str):
        self.run_dir, self.pid, self.weights_path = run_dir, pid, weights_path
        self.same_bot = weights_path is not None and os.path.abspath(weights_path) == os.path.abspath(mine)
        if pid == os.getpid():
            who = "another Agent in this same process"
        elif pid is not None:
            who = f"process {pid}"
        else:
            who = "another process (it has not recorded its PID yet)"
        whose = f", the bot of weights {weights_path!r}" if weights_path else ""
        then = ("Stop that bot first (or wait for it to close), or give this one another --run-dir" if self.same_bot
                else "Give each bot its own --run-dir")
        super().__init__(f"--run-dir {run_dir!r} is in use by {who}{whose}: two bots in one run directory would "
                         "interleave their metrics and episodes and overwrite each other's status.json. " + then)


class RunDirClaim(HeldFile):
    """A non-blocking exclusive claim on a run directory, held until ``release()`` or process exit."""

    def __init__(self, run_dir: str, weights_path: str):
        super().__init__(os.path.join(run_dir, CLAIM_NAME))
        self.run_dir, self.weights_path = run_dir, weights_path

    def acquire(self) -> RunDirClaim:
        """Take the claim or raise ``RunDirInUse`` at once.  The directory must exist; an OSError
        (read-only directory, a directory in the file's place) passes through."""

        def held(fd: int) -> RunDirInUse:
            holder = _read(fd)
            return RunDirInUse(self.run_dir, holder.get("pid"), holder.get("weights_path"), self.weights_path)

        self._take(json.dumps({"pid": os.getpid(), "weights_path": os.path.abspath(self.weights_path)}).encode(),
                   held)
        return self

    def release(self) -> None:
        """Give the run directory up (closing the file releases the flock); the file stays."""
        self._free()


def _read(fd: int) -> dict:
    try:
        rec = json.loads(read_record(fd, 65536).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(rec, dict):
        return {}
    pid, weights = rec.get("pid"), rec.get("weights_path")
    return {"pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            "weights_path": weights if isinstance(weights, str) else None}
