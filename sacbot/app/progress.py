"""The run's progress on stderr, in the form that fits where stderr goes.

* A terminal gets one live rich line, redrawn twice a second.
* Anything else (a pipe, a file, CI, ``nohup``, a runner's log) gets a full plain line every
  ``interval`` seconds and one at the end, as tqdm's non-tty mode and SB3's logger do.  A live
  line there would be cut to rich's default 80 columns and drawn once, at the end
  (``s… steps 9988  ret(avg20) 8.1 … dr…``).

Usage::

    progress = Progress(enabled=True, total=10_000)
    for steps in ...:
        progress.update(steps, lambda: f"steps {steps}  ...")   # text built only when shown
    progress.close()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

# Seconds between plain lines: often enough to see a stall in a CI log within a minute, rare
# enough that a day-long run's log stays small (8,640 lines a day).  tqdm's non-tty default
# is similar in spirit (its mininterval is raised for files); SB3 logs every N episodes.
PLAIN_INTERVAL_S = 10.0
LIVE_INTERVAL_S = 0.5  # redraws of the terminal line


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of one run; ``enabled=False`` (``--quiet``) shows nothing."""

    def __init__(self, enabled: bool, total: int | None, *, stream: TextIO | None = None,
                 interval: float | None = None, live: bool | None = None):
        """``stream`` defaults to stderr; ``live`` to whether it is a terminal; ``interval`` to
        :data:`PLAIN_INTERVAL_S` (seconds between plain lines)."""
        self.enabled = enabled
        self.total = total
        self.stream = stream or sys.stderr
        self.live = _is_terminal(self.stream) if live is None else live
        self.interval = PLAIN_INTERVAL_S if interval is None else interval
        self._start = time.monotonic()
        self._last = self._start if not self.live else float("-inf")  # a live line draws at once
        self._text: Callable[[], str] | None = None  # the newest update's text, for the final line
        self._steps = 0
        self._bar = None
        if enabled and self.live:
            self._start_live()

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("[bold]sacbot"), BarColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), transient=False, console=Console(file=self.stream))
        self._task = self._bar.add_task("", total=self.total)
        self._bar.start()

    def update(self, steps: int, text: Callable[[], str]) -> None:
        """``text`` is called only when a line is drawn, not every tick."""
        if not self.enabled:
            return
        self._text, self._steps = text, steps
        now = time.monotonic()
        if self._bar is not None:
            if now - self._last > LIVE_INTERVAL_S:
                self._last = now
                self._bar.update(self._task, completed=steps, description=text())
        elif now - self._last >= self.interval:
            self._last = now
            self._print(text(), now)

    def _print(self, text: str, now: float) -> None:
        try:
            print(f"sacbot {_elapsed(now - self._start)}  {text}", file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed pipe or file: progress is not worth a crash
            self.enabled = False

    def close(self) -> None:
        """Stop the live line; in plain mode print the last state once more."""
        if self._bar is not None:
            if self._text is not None:  # the final state, not the one of up to 0.5 s before
                self._bar.update(self._task, completed=self._steps, description=self._text())
            self._bar.stop()
            self._bar = None
        elif self.enabled and self._text is not None:
            self._print(self._text(), time.monotonic())
        self.enabled = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
