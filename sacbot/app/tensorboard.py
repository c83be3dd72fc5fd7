"""TensorBoard scalars beside the run's JSONL files (``--tensorboard DIR``, the tensorboard extra).

The JSONL files stay the source of truth.  A sink thread in the CLI process tails them and
writes their numbers with tensorboard's own event writer (protobuf only: no torch, no
tensorflow), so nothing on the acting or training path waits on it:

* ``training_metrics.jsonl``: ``train/<field>`` for every number (losses, alpha, buffer_size,
  ``train/drops/transition``, ...), at the cumulative gradient step;
* ``episodes.jsonl``: ``episode/return``, ``episode/length``, ``episode/won``,
  ``episode/return_avg20``, ``episode/win_rate_last20``, the same per opponent under
  ``opponent/<name>/``, and the act latency ``latency/act_p50_us``, ``act_p99_us``,
  ``act_max_us``, at the episode's cumulative env step (its number in runs written before);
* ``evals.jsonl`` (the runner's evals): ``eval/<field>`` and ``eval/<opponent>/<field>``, at
  the runner's round count.

Only lines appended after the sink starts are written: the lines of an earlier run in the same
run directory were written by that run's sink.

    sink = start_sink(cfg)          # None without --tensorboard
    ...
    sink.stop(timeout=10)           # a last pass: every line written before stop is in
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator

from sacbot.config import Config, ConfigError

log = logging.getLogger("sacbot")

EXTRA = "pip install 'sacbot[tensorboard]'"
WINDOW = 20  # episodes in the moving return and win rate, as in the progress line's (avg20)
POLL_S = 1.0  # how often the files are read: TensorBoard itself reloads every 5 s or more
MAX_READ = 8 << 20  # bytes read from one file per pass, so a huge backlog cannot stall a stop

Row = tuple[int, float, str, float]  # step, wall time, tag, value


def _writer_class():
    """tensorboard's event writer, or a ConfigError naming the extra (the CLI exits 2)."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise ConfigError(f"tensorboard needs the tensorboard extra, which is not installed ({e}); "
                          f"expected: {EXTRA}, or run without --tensorboard") from None
    return EventFileWriter


class JsonlTail:
    """The complete lines appended to one JSONL file since the last read.  A line still being
    written (no newline yet) waits for the next read; a line that is not a JSON object is
    counted in ``bad`` and skipped."""

    def __init__(self, path: str, from_end: bool = True):
        self.path = path
        self.offset = os.path.getsize(path) if from_end and os.path.isfile(path) else 0
        self._partial = b""
        self.bad = 0

    def read(self) -> list[dict]:
        try:
            size = os.path.getsize(self.path)
            if size < self.offset:  # replaced or truncated: read it from the top
                self.offset, self._partial = 0, b""
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_READ)
        except FileNotFoundError:  # not written yet (evals.jsonl comes from the runner, if any)
            return []
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            if isinstance(rec, dict):
                out.append(rec)
            else:
                self.bad += 1
        return out


def _numbers(rec: dict, prefix: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, float]]:
    """Every number in ``rec`` as ``(prefix + key, value)``; nested dicts become ``key/inner``.
    Booleans count as 0/1; NaN and inf are kept (a NaN loss is worth seeing)."""
    for k, v in rec.items():
        if k in skip:
            continue
        if isinstance(v, bool | int | float):
            yield f"{prefix}{k}", float(v)
        elif isinstance(v, dict):
            yield from _numbers(v, f"{prefix}{k}/")


class Scalars:
    """Turns JSONL records into TensorBoard rows; keeps the windows the moving averages need."""

    def __init__(self):
        self._recent: dict[str, deque] = defaultdict(lambda: deque(maxlen=WINDOW))  # (return, won)
        self._evals = 0

    def train(self, rec: dict) -> list[Row]:
        # The step is the cumulative gradient step: "steps" since the original's field names
        # (where "grad_steps" counts one pass's), "grad_steps" in older lines (docs/reference.md).
        key = "steps" if "steps" in rec else "grad_steps"
        step = rec.get(key)
        if not isinstance(step, int):  # an error line: no pass, no numbers
            return []
        t = _wall(rec, "wall_time")
        return [(step, t, tag, v) for tag, v in _numbers(rec, "train/", skip=(key, "wall_time", "time"))]

    def episode(self, rec: dict) -> list[Row]:
        # At the cumulative env step, as SB3's and CleanRL's global_step, so curves can be laid over
        # theirs; at the episode number for a run written before episodes carried env_steps.
        step = rec.get("env_steps") if isinstance(rec.get("env_steps"), int) else rec.get("episode")
        t, ret = _wall(rec, "time"), rec.get("return")
        if not isinstance(step, int) or not isinstance(ret, int | float):
            return []
        won = rec.get("won") if isinstance(rec.get("won"), bool) else None
        rows = [(step, t, "episode/return", float(ret))]
        if isinstance(rec.get("length"), int):
            rows.append((step, t, "episode/length", float(rec["length"])))
        if won is not None:
            rows.append((step, t, "episode/won", float(won)))
        rows += [(step, t, f"latency/{k}", float(rec[k])) for k in ("act_p50_us", "act_p99_us", "act_max_us")
                 if isinstance(rec.get(k), int | float)]
        rows += self._windowed("", "episode/", step, t, float(ret), won)
        opponent = str(rec.get("opponent") or "")
        if opponent:  # per opponent too, as the closing summary and the evals give it
            rows.append((step, t, f"opponent/{opponent}/return", float(ret)))
            rows += self._windowed(opponent, f"opponent/{opponent}/", step, t, float(ret), won)
        return rows

    def _windowed(self, key: str, prefix: str, step: int, t: float, ret: float, won: bool | None) -> list[Row]:
        """The moving return and win rate of the last WINDOW episodes (of one opponent, or all)."""
        recent = self._recent[key]
        recent.append((ret, won))
        rows = [(step, t, f"{prefix}return_avg{WINDOW}", sum(r for r, _ in recent) / len(recent))]
        outcomes = [w for _, w in recent if w is not None]
        if outcomes:
            rows.append((step, t, f"{prefix}win_rate_last{WINDOW}", sum(outcomes) / len(outcomes)))
        return rows

    def eval(self, rec: dict) -> list[Row]:
        self._evals += 1
        step = rec.get("rounds") if isinstance(rec.get("rounds"), int) else self._evals
        t = _wall(rec, "time")
        per = rec.get("per_opponent") if isinstance(rec.get("per_opponent"), dict) else {}
        rows = [(step, t, tag, v) for tag, v in _numbers(rec, "eval/", skip=("per_opponent", "rounds", "time"))]
        for opp, r in per.items():
            if isinstance(r, dict):
                rows += [(step, t, tag, v) for tag, v in _numbers(r, f"eval/{opp or '-'}/")]
        return rows


def _wall(rec: dict, key: str) -> float:
    v = rec.get(key)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else time.time()


class TensorBoardSink(threading.Thread):
    """Named thread that tails ``files`` (kind -> path; kinds ``train``, ``episodes``,
    ``evals``) and writes their scalars to event files in ``logdir``.  Its errors are kept in
    ``error`` and printed; they never stop a run."""

    def __init__(self, logdir: str, files: dict[str, str], poll_s: float = POLL_S):
        super().__init__(name="sacbot-tensorboard", daemon=True)
        writer_class = _writer_class()
        try:
            os.makedirs(logdir, exist_ok=True)
        except OSError as e:
            why = "a file is in the way" if os.path.isfile(logdir) else e.strerror
            raise ConfigError(f"tensorboard = {logdir!r} cannot be used as a directory: {why}; "
                              "expected a directory for TensorBoard's event files") from None
        self.logdir, self.poll_s = logdir, poll_s
        self.scalars = Scalars()
        convert: dict[str, Callable[[dict], list[Row]]] = {
            "train": self.scalars.train, "episodes": self.scalars.episode, "evals": self.scalars.eval}
        self.tails = [(JsonlTail(path), convert[kind]) for kind, path in files.items()]
        self.writer = writer_class(logdir, flush_secs=max(1, int(poll_s)))
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.written = 0

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.poll_s):
                self.poll()
            self.poll()  # the lines written before stop (the final metrics line, the last episode)
        except Exception as e:  # noqa: BLE001 - kept, printed; the run goes on without scalars
            self.error = f"{type(e).__name__}: {e}"
            log.error(f"TensorBoard sink stopped: {self.error}; the JSONL files are complete")
        finally:
            self.writer.close()

    def poll(self) -> int:
        """One pass over the files; returns the scalars written."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        n = 0
        for tail, convert in self.tails:
            for rec in tail.read():
                for step, t, tag, value in convert(rec):
                    self.writer.add_event(Event(wall_time=t, step=step, summary=Summary(
                        value=[Summary.Value(tag=tag, simple_value=value)])))
                    n += 1
        if n:
            self.writer.flush()
        self.written += n
        return n

    def stop(self, timeout: float) -> bool:
        """Write what is left and close the event file; False if that took over ``timeout``."""
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout)
        return not self.is_alive()


def start_sink(cfg: Config) -> TensorBoardSink | None:
    """The running sink for ``cfg.tensorboard``, or None when it is empty."""
    if not cfg.tensorboard:
        return None
    sink = TensorBoardSink(cfg.tensorboard, {
        "train": cfg.metrics_path,
        "episodes": os.path.join(cfg.run_dir, "episodes.jsonl"),
        "evals": os.path.join(cfg.run_dir, "evals.jsonl")})
    sink.start()
    return sink
