"""Training runner: launch N bots, watch their round counters, restart frozen or crashed ones.

Usage::

    python tools/run_training.py --bots 2 --root runs/campaign --freeze-timeout 60 -- --steps 200000
    sacbot runner --bots 2 --root runs/campaign -- --env sacbot/TankDuel-v0

Each bot gets its own directory (``ROOT/bot<i>/run`` and ``ROOT/bot<i>/weights``) and seed.
Bots do not share weights: two processes writing one ``sac_latest.zip`` would race, and a
crash or freeze in one would stall the other's experience.  Every 0.5 s the runner reads
each bot's round counter and status.json (reported with events and in the summary); after
a startup grace period, a counter that has not moved for
``--freeze-timeout`` seconds marks the bot frozen: SIGTERM, SIGKILL after ``--kill-grace``,
then a restart after an exponential backoff.  A bot that exits non-zero is restarted too;
one that exits 0 has finished; one that exits 2 (a bad flag or setting) stops the runner at
once, with the bot's message, since a restart would fail the same way.  Past
``--max-restarts`` restarts of one bot within ``--restart-window`` seconds, the runner stops every
bot and exits 1 with a summary; older restarts are forgiven, so a few crashes spread over weeks do
not stop a bot for good.  The runner's own I/O errors (a full disk while copying a checkpoint for
eval, a bot's log that cannot be opened, a ``best.zip`` that cannot be written) are events
(``io_error``), never the end of the campaign.
SIGINT/SIGTERM to the runner closes every bot gracefully (each makes its final save) and
exits 0.

Every ``--eval-every-rounds`` rounds (or ``--eval-every-minutes``) of a bot, its newest
checkpoint is copied aside and evaluated by ``sacbot eval`` in eval mode, ``--eval-episodes``
per opponent of the env's schedule (a separate process that writes no weights);
results go to the bot's ``evals.jsonl`` and the best checkpoint by mean return is kept as
``best.zip``, copied atomically.  Events go to ``ROOT/runner_events.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback

from sacbot.console import die_with_parent
from sacbot.store.atomic import atomic_write_bytes
from sacbot.store.files import append_jsonl, error_kind
from sacbot.store.format import LATEST
from sacbot.store.liveness import read_round_counter, read_status

POLL_S = 0.5
CONFIG_ERROR = 2  # sacbot's exit code for a bad setting, and argparse's for a bad flag
log = logging.getLogger("sacbot")


def _err(e: BaseException) -> str:
    return f"{error_kind(e)}: {e}"


class Bot:
    def __init__(self, i: int, root: str, cmd: list[str], args: list[str], seed: int):
        self.i, self.cmd, self.args, self.seed = i, cmd, args, seed
        self.dir = os.path.join(root, f"bot{i}")
        self.run_dir = os.path.join(self.dir, "run")
        self.weights = os.path.join(self.dir, "weights")
        self.counter_path = os.path.join(self.weights, "round_counter.txt")
        self.proc: subprocess.Popen | None = None
        self.restarts = 0  # over the runner's life, for the summary
        self.restart_times: list[float] = []  # those within --restart-window (monotonic), for giving up
        self.started = self.last_move = 0.0
        self.last_count: int | None = None
        self.next_start = 0.0
        self.finished = False
        self.stopping_since: float | None = None
        self.eval_proc: subprocess.Popen | None = None
        self.eval_copy = os.path.join(self.dir, "eval", LATEST)
        self.next_eval_round: int | None = None
        self.next_eval_time: float | None = None
        self.best: float | None = None
        self.log = None
        self.alive = False
        self.status: dict = {}  # the bot's last status.json heartbeat

    def argv(self) -> list[str]:
        return self.cmd + self.args + ["--run-dir", self.run_dir, "--weights-path", self.weights,
                                       "--seed", str(self.seed), "--quiet"]

    def last_log_line(self) -> str:
        """The last non-empty line the bot wrote (its error message, when it failed)."""
        try:
            with open(os.path.join(self.dir, "bot.log"), "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
                lines = [x for x in fh.read().decode(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "(no bot.log)"
        return lines[-1] if lines else "(bot.log is empty)"

    def start(self, now: float, io_error) -> None:
        """Launch the bot.  ``io_error(what, path, exc)`` is told of what could not be done on
        the way (its directory, its log), which does not stop the start; an OSError of the launch
        itself is raised."""
        try:
            os.makedirs(self.run_dir, exist_ok=True)
        except OSError as e:  # the bot makes it itself, or says why it cannot
            io_error("making the bot's run directory", self.run_dir, e)
        if self.log is not None:
            self.log.close()
        out = None  # the runner's own stderr, when bot.log cannot be opened: the bot's words are kept
        try:
            self.log = out = open(os.path.join(self.dir, "bot.log"), "a")
        except OSError as e:
            self.log = None
            io_error("opening the bot's log (its output goes to the runner's stderr)",
                     os.path.join(self.dir, "bot.log"), e)
        self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT if out else None,
                                     preexec_fn=die_with_parent(os.getpid()))
        self.started = self.last_move = now
        self.last_count = read_round_counter(self.counter_path)
        self.alive = False
        self.stopping_since = None


class Runner:
    def __init__(self, a):
        self.a = a
        os.makedirs(a.root, exist_ok=True)
        self.events_path = os.path.join(a.root, "runner_events.jsonl")
        self.bots = [Bot(i, a.root, a.bot_cmd, a.bot_args, a.seed + i) for i in range(a.bots)]
        self.stop_requested = False
        self.failed: str | None = None
        self.failed_code = 1  # 2 when a bot refused its settings: the campaign's settings are wrong

    def event(self, kind: str, bot: Bot | None = None, **kw) -> None:
        rec = {"time": time.time(), "event": kind, **({"bot": bot.i} if bot else {}), **kw}
        append_jsonl(self.events_path, rec)
        if not self.a.quiet:
            print(f"runner: {kind}" + (f" bot{bot.i}" if bot else "") + (f" {kw}" if kw else ""),
                  file=sys.stderr, flush=True)

    def io_error(self, bot: Bot | None, doing: str, path: str, e: BaseException) -> None:
        """An I/O error of the runner's own (a full disk, a path in the way): an event, and the
        campaign goes on."""
        self.event("io_error", bot, doing=doing, path=path, error=_err(e))

    def start_bot(self, b: Bot, now: float, kind: str) -> None:
        """Start ``b``; a launch that fails (no memory for a process, the command gone) is an
        event and counts as a crash, so it is retried after the backoff."""
        try:
            b.start(now, lambda doing, path, e: self.io_error(b, doing, path, e))
        except OSError as e:
            b.proc = None
            self.event("start_failed", b, error=_err(e))
            self.schedule_restart(b, now, f"could not start: {_err(e)}")
            return
        self.event(kind, b, pid=b.proc.pid, **({"restarts": b.restarts} if kind == "restarted" else {}))

    def on_signal(self, signum, frame) -> None:
        if self.stop_requested:
            os._exit(128 + signum)
        self.stop_requested = True

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self.on_signal)
        try:
            self.watch()
        except Exception as e:  # noqa: BLE001 - a fault of the runner itself: still stop the bots and say why
            log.error("the runner failed:\n%s", traceback.format_exc())
            self.failed = f"the runner failed: {type(e).__name__}: {e}"
        self.stop_all()
        now = time.monotonic()
        summary = {"bots": [{"bot": b.i, "restarts": b.restarts, "finished": b.finished,
                             "restarts_in_window": sum(now - t < self.a.restart_window for t in b.restart_times),
                             "rounds": read_round_counter(b.counter_path), "best_eval": b.best,
                             "learner_steps": b.status.get("learner_steps"),
                             "last_error": b.status.get("last_error")}
                            for b in self.bots]}
        if self.failed:
            self.event("gave_up", reason=self.failed, **summary)
            print(f"runner: giving up: {self.failed}\n{json.dumps(summary, indent=1)}", file=sys.stderr)
            return self.failed_code
        self.event("stopped", **summary)
        return 0

    def watch(self) -> None:
        """Start the bots, then poll them until they finish, a stop is asked, or the runner gives up."""
        now = time.monotonic()
        for b in self.bots:
            self.start_bot(b, now, "started")
        while not self.stop_requested and self.failed is None:
            now = time.monotonic()
            for b in self.bots:
                try:
                    self.check(b, now)
                except OSError as e:  # one the specific handlers did not foresee: the campaign goes on
                    self.io_error(b, "watching the bot", getattr(e, "filename", None) or "", e)
            if all(b.finished for b in self.bots):
                break
            time.sleep(POLL_S)  # the polling period of the watchdog, not a synchronisation

    def check(self, b: Bot, now: float) -> None:
        self.check_eval(b)
        if b.finished:
            return
        if b.proc is None:
            if now >= b.next_start:
                self.start_bot(b, now, "restarted")
            return
        code = b.proc.poll()
        if code is not None:
            b.proc = None
            if b.stopping_since is not None:  # we stopped it for a freeze: schedule the restart
                self.schedule_restart(b, now, "frozen")
            elif code == 0:
                b.finished = True
                self.event("finished", b)
            elif code == CONFIG_ERROR:
                # A bad flag or setting fails the same way every time: restarting cannot help.
                said = b.last_log_line()
                self.event("config_error", b, code=code, message=said)
                self.failed = f"bot{b.i} rejected its configuration (exit code 2): {said}"
                self.failed_code = CONFIG_ERROR
            else:
                self.event("crashed", b, code=code)
                self.schedule_restart(b, now, f"exit code {code}")
            return
        if b.stopping_since is not None:
            if now - b.stopping_since > self.a.kill_grace:
                b.proc.kill()
                self.event("killed", b)
            return
        count = read_round_counter(b.counter_path)
        b.status = read_status(os.path.join(b.run_dir, "status.json")) or b.status
        if count != b.last_count:
            if not b.alive:
                b.alive = True  # said once per start: the bot has finished a round
                self.event("alive", b, rounds=count)
            b.last_count, b.last_move = count, now
            self.maybe_eval(b, count)
        elif now - b.started > self.a.grace and now - b.last_move > self.a.freeze_timeout:
            hb = b.status.get("time")
            self.event("frozen", b, rounds=count, still_for=round(now - b.last_move, 2),
                       heartbeat_age_s=round(time.time() - hb, 1) if hb else None,
                       last_error=b.status.get("last_error"))
            b.proc.send_signal(signal.SIGTERM)
            b.stopping_since = now

    def schedule_restart(self, b: Bot, now: float, why: str) -> None:
        """Count the restart among those of the last ``--restart-window`` seconds (older ones are
        forgiven), give up past ``--max-restarts`` of them, else restart after the backoff, which
        grows with the recent restarts only."""
        b.restarts += 1
        window = self.a.restart_window
        b.restart_times = [t for t in b.restart_times if now - t < window] + [now]
        recent = len(b.restart_times)
        if recent > self.a.max_restarts:
            self.failed = (f"bot{b.i} needed more than {self.a.max_restarts} restarts within {window:g} s "
                           f"(last: {why})")
            return
        delay = min(self.a.backoff * 2 ** (recent - 1), self.a.max_backoff)
        b.next_start = now + delay
        self.event("restart_scheduled", b, why=why, delay_s=delay)

    def stop_all(self) -> None:
        procs = [b.proc for b in self.bots if b.proc is not None]
        procs += [b.eval_proc for b in self.bots if b.eval_proc is not None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.a.stop_deadline
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                self.event("killed_at_stop", pid=p.pid)

    # --- periodic eval -----------------------------------------------------------------
    def maybe_eval(self, b: Bot, count: int | None) -> None:
        k, minutes = self.a.eval_every_rounds, self.a.eval_every_minutes
        if count is None or b.eval_proc is not None or not (k or minutes):
            return
        now = time.monotonic()
        if b.next_eval_round is None:  # first round seen: schedule, do not evaluate yet
            b.next_eval_round = (count // k + 1) * k if k else None
            b.next_eval_time = now + 60 * minutes if minutes else None
            if k:
                return
        due = (k and b.next_eval_round is not None and count >= b.next_eval_round) or (
            minutes and b.next_eval_time is not None and now >= b.next_eval_time)
        latest = os.path.join(b.weights, LATEST)
        if not due or not os.path.exists(latest):
            return
        if k:
            b.next_eval_round = (count // k + 1) * k
        if minutes:
            b.next_eval_time = now + 60 * minutes
        try:
            os.makedirs(os.path.dirname(b.eval_copy), exist_ok=True)
            shutil.copyfile(latest, b.eval_copy)  # evaluate a fixed copy: the bot keeps saving
        except OSError as e:  # a full disk: this eval is skipped, the next one is tried when due
            self.io_error(b, "copying the checkpoint for eval (this eval is skipped)", b.eval_copy, e)
            try:
                os.remove(b.eval_copy)  # a partial copy takes space and is no bot
            except OSError:
                pass
            return
        cmd = self.a.eval_cmd + self.a.bot_args + ["--weights-path", os.path.dirname(b.eval_copy),
                                                   "--run-dir", os.path.join(b.dir, "eval"),
                                                   "--episodes-per-opponent", str(self.a.eval_episodes), "--json"]
        try:
            b.eval_proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                           env={**os.environ, "SACBOT_EVAL_MODE": "1"},
                                           preexec_fn=die_with_parent(os.getpid()))
        except OSError as e:
            self.io_error(b, "starting the eval (this eval is skipped)", cmd[0], e)
            return
        b.eval_round = count
        self.event("eval_started", b, rounds=count)

    def check_eval(self, b: Bot) -> None:
        p = b.eval_proc
        if p is None or p.poll() is None:
            return
        b.eval_proc = None
        out = p.stdout.read() if p.stdout else ""
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.event("eval_failed", b, code=p.returncode)
            return
        rec = {"time": time.time(), "rounds": b.eval_round, **res}
        append_jsonl(os.path.join(b.run_dir, "evals.jsonl"), rec)
        mean = res.get("mean_return")
        if mean is not None and (b.best is None or mean > b.best):
            best = os.path.join(b.dir, "best.zip")
            try:
                with open(b.eval_copy, "rb") as fh:
                    atomic_write_bytes(best, fh.read())
            except OSError as e:  # best.zip keeps the last best it holds; a later better eval tries again
                self.io_error(b, f"writing the new best (mean return {mean})", best, e)
                return
            b.best = mean
            self.event("new_best", b, mean_return=mean, rounds=b.eval_round)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sacbot runner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bots", type=int, default=1)
    p.add_argument("--root", default="runs/campaign", help="one directory per bot below it")
    p.add_argument("--seed", type=int, default=0, help="bot i gets seed + i")
    p.add_argument("--freeze-timeout", type=float, default=120.0, help="seconds without a new round")
    p.add_argument("--grace", type=float, default=60.0, help="startup grace before freeze checks")
    p.add_argument("--kill-grace", type=float, default=15.0, help="SIGTERM to SIGKILL, seconds")
    p.add_argument("--max-restarts", type=int, default=5,
                   help="per bot within --restart-window, before giving up")
    p.add_argument("--restart-window", type=float, default=3600.0,
                   help="seconds a restart counts against --max-restarts; older ones are forgiven")
    p.add_argument("--backoff", type=float, default=1.0, help="first restart delay; doubles each time")
    p.add_argument("--max-backoff", type=float, default=60.0)
    p.add_argument("--stop-deadline", type=float, default=60.0, help="seconds for bots to close at stop")
    p.add_argument("--eval-every-rounds", type=int, default=0, help="evaluate every K rounds of a bot (0: off)")
    p.add_argument("--eval-every-minutes", type=float, default=0.0, help="evaluate every K minutes (0: off)")
    p.add_argument("--eval-episodes", type=int, default=5, help="episodes per opponent of the env's schedule")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--bot-cmd", default=f"{sys.executable} -m sacbot run",
                   help="command that starts one bot (default: this Python's sacbot run)")
    p.add_argument("--eval-cmd", default=f"{sys.executable} -m sacbot eval")
    p.add_argument("bot_args", nargs="*", help="after --: extra arguments for every bot and eval")
    return p


def main(argv: list[str] | None = None) -> int:
    from sacbot.console import setup_logging

    setup_logging()  # a file the runner cannot write is said on stderr (tools/run_training.py too)
    a = parser().parse_args(argv)
    for name, least in (("bots", 1), ("max_restarts", 0), ("eval_every_rounds", 0), ("eval_episodes", 1)):
        if getattr(a, name) < least:
            print(f"runner: --{name.replace('_', '-')} = {getattr(a, name)} is not accepted: expected an integer "
                  f">= {least}", file=sys.stderr)
            return 2
    # Seconds: finite (nan never compares, so --freeze-timeout nan would never detect a freeze).
    for name in ("freeze_timeout", "grace", "kill_grace", "backoff", "max_backoff", "stop_deadline",
                 "eval_every_minutes", "restart_window"):
        v, positive = getattr(a, name), name in ("freeze_timeout", "restart_window")
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            print(f"runner: --{name.replace('_', '-')} must be a finite number {'>' if positive else '>='} 0, "
                  f"got {v}", file=sys.stderr)
            return 2
    if not a.root.strip() or (os.path.exists(a.root) and not os.path.isdir(a.root)):
        print(f"runner: --root {a.root!r} is not accepted: expected a directory (one directory per bot goes below "
              "it)", file=sys.stderr)
        return 2
    owned = [f for f in a.bot_args if f.split("=")[0] in ("--weights-path", "--run-dir")]
    if owned:
        # Each bot's weights and run directories are its own, below --root: the runner's flags come
        # after these and win, so a user's would be silently ignored.
        print(f"runner: {owned[0].split('=')[0]} is set by the runner for each bot (ROOT/botN/weights and "
              "ROOT/botN/run); choose where with --root", file=sys.stderr)
        return 2
    a.bot_cmd, a.eval_cmd = a.bot_cmd.split(), a.eval_cmd.split()
    try:
        runner = Runner(a)
    except OSError as e:  # --root cannot be made: no permission, a file in the path
        print(f"runner: --root {a.root!r} cannot be used as a directory: {e.strerror}", file=sys.stderr)
        return 2
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
