"""What every command shares on the console: the "sacbot" logger on stderr, and signals.

    setup_logging()                    # "sacbot: message" on stderr; once per process
    log = logging.getLogger("sacbot")  # every module logs here (or to an adapter of it)
    signals = Signals(stop); signals.install()   # 1st SIGINT/SIGTERM: graceful close; 2nd: exit now
    subprocess.Popen(cmd, preexec_fn=die_with_parent(os.getpid()))   # a child that ends with its parent
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading


class Signals:
    """First SIGINT/SIGTERM starts a graceful close; a second exits at once."""

    def __init__(self, stop: threading.Event, closing: str = "closing (final save)"):
        self.stop, self.closing = stop, closing
        self.count = 0  # signals seen: the run itself sets ``stop`` (--steps reached), not a signal
        self.signum = 0  # the last one

    def __call__(self, signum, frame):
        self.count += 1
        self.signum = signum
        if self.count > 1:
            os._exit(128 + signum)
        print(f"sacbot: {signal.Signals(signum).name}: {self.closing}; send again to exit now",
              file=sys.stderr, flush=True)
        self.stop.set()

    def install(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self)


def die_with_parent(parent_pid: int):
    """A ``preexec_fn`` that has Linux send the child SIGTERM when its parent dies, even by
    ``kill -9``: an orphaned bot would go on writing its weights directory beside the bot a
    restarted parent launches there.  SIGTERM, not SIGKILL, so the orphan still makes its
    final save.  Elsewhere it does nothing (the bots' writer lock still refuses a second
    writer)."""
    def preexec() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec if sys.platform.startswith("linux") else None


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time, so a redirected stderr is honoured."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


# Where sacbot says what it does: the "sacbot" logger, or an adapter of it (a server's bot names
# itself).  SILENT is for a look that must say nothing (a probe of the weights before a start).
Log = logging.Logger | logging.LoggerAdapter
SILENT = logging.getLogger("sacbot.silent")
SILENT.propagate = False
SILENT.addHandler(logging.NullHandler())


def setup_logging(level: int = logging.INFO) -> logging.Logger:
    """The "sacbot" logger to stderr as ``sacbot: message``; calling it again adds nothing."""
    logger = logging.getLogger("sacbot")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("sacbot: %(message)s"))
        logger.addHandler(h)
    logger.setLevel(level)
    return logger
