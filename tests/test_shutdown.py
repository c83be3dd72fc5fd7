"""Starting and stopping a bot.

A failed start leaves nothing behind: no thread, no child process, no lock, nothing written, in
the Python API and in the CLI.  Every wait of the acting side wakes on the stop request and has a
deadline: SIGINT/SIGTERM close within about a second whatever the learner is doing, and a learner
that cannot finish its final save (stopped, or writing to a disk that hangs) makes the bot exit
within ``--final-save-timeout``, saying the save was not confirmed.

The signal tests run the bot in a subprocess with hard timeouts; the slow parts of a learner are
patched in by a script the bot runs (a process learner imports that script again under spawn, so
its child is patched too).  What the tests wait on is the child's own stderr lines and exits.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import (
    ACT_SPACE,
    OBS_SPACE,
    StderrWatcher,
    dir_digests,
    play,
    read_status,
    small_cfg,
    wait_exit,
    wait_until,
)

from sacbot import Agent
from sacbot.acting.agent import AgentError
from sacbot.config import ConfigError
from sacbot.store.lock import WriterLock

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sizes of small_cfg, as flags: a checkpoint made through the API resumes from the CLI.
SMALL = ["--env", "Pendulum-v1", "--hidden", "8", "--batch-size", "2", "--seq-len", "4", "--learning-starts", "4",
         "--calib-updates", "2", "--quiet"]


def _sacbot_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("sacbot-") and t.is_alive()}


def _children() -> set[int]:
    """PIDs whose parent is this process, unreaped (zombie) ones included, less multiprocessing's
    resource tracker (one per process that ever spawned, by design)."""
    me, out = os.getpid(), set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                if b"resource_tracker" in fh.read():
                    continue
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        out.add(int(p))
    return out


def _zips(wdir) -> dict[str, str]:
    return {k: v for k, v in dir_digests(wdir).items() if k.endswith(".zip")}


def _unchecked_meta(monkeypatch) -> None:
    """Switch off the checkpoint's own check of the training meta (sacbot.store.checkpoint refuses a bad
    acting noise state at write and at read): the value then reaches the Agent, after its learner
    has started, as any value the acting side refuses would."""
    from sacbot.store import state, write

    for where in (state, write):  # the check's users: the writer and the reader
        monkeypatch.setattr(where, "training_state_problem", lambda *a, **k: None)


def _bot_with_foreign_rng_state(cfg) -> None:
    """A checkpoint whose saved acting noise state is a PCG64DXSM's: the learner loads it, the acting
    side cannot restore it into its PCG64 generator.  Made by a thread learner: the patch of
    ``_unchecked_meta`` does not reach a learner process."""
    agent = Agent(dataclasses.replace(cfg, learner="thread"), OBS_SPACE, ACT_SPACE)
    play(agent, 12)
    agent.rng = np.random.Generator(np.random.PCG64DXSM(1))
    assert agent.close()["final_save"]["ok"]


def _assert_nothing_left(cfg, threads_before: set, children_before: set, zips_before: dict) -> None:
    left = _sacbot_threads() - threads_before
    assert not left, f"threads left running: {sorted(t.name for t in left)}"
    assert _children() - children_before == set(), "a learner process was left behind"
    assert _zips(cfg.weights_dir) == zips_before, "a failed start wrote a checkpoint"
    WriterLock(cfg.weights_dir).acquire().close()  # free at once, without waiting for anything


# --- a failed start leaves nothing behind ---------------------------------------------------------
@pytest.mark.timeout(90)
def test_a_checkpoint_the_acting_side_refuses_leaves_no_thread_child_or_lock(tmp_path, monkeypatch, learner_kind):
    """The learner started (and, as a process, took the lock itself) before the Agent read the
    checkpoint's acting noise state; its refusal used to leave the training and I/O threads (or the
    child and its pipe threads) running and the weights directory locked."""
    _unchecked_meta(monkeypatch)
    cfg = small_cfg(tmp_path, learner=learner_kind, pace="lockstep")
    _bot_with_foreign_rng_state(cfg)
    threads, children, zips = _sacbot_threads(), _children(), _zips(cfg.weights_dir)
    with pytest.raises((AgentError, ConfigError), match="acting"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    _assert_nothing_left(cfg, threads, children, zips)
    # A second Agent in this same process takes the directory, once the refused file is gone.
    for name in zips:
        os.unlink(os.path.join(cfg.weights_dir, name))
    second = Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert second.learner is not None
    assert second.close()["final_save"]["ok"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["oserror", "keyboard-interrupt"])
def test_any_exception_after_the_learner_started_leaves_nothing(tmp_path, monkeypatch, learner_kind, exc):
    """Not only a refused checkpoint: anything raised once the learner runs (here by the round
    counter, the last thing the Agent builds), a Ctrl-C included."""
    import sacbot.acting.agent

    def fail(path):
        raise exc

    monkeypatch.setattr(sacbot.acting.agent, "RoundCounter", fail)
    cfg = small_cfg(tmp_path, learner=learner_kind)
    threads, children = _sacbot_threads(), _children()
    with pytest.raises(type(exc)):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    _assert_nothing_left(cfg, threads, children, {})
    monkeypatch.undo()
    second = Agent(cfg, OBS_SPACE, ACT_SPACE)  # the same directory, the same process
    second.close()


UNCHECKED_META = """
import sys
from sacbot.store import state, write

state.training_state_problem = write.training_state_problem = lambda *a, **k: None  # see _unchecked_meta
"""


@pytest.mark.timeout(120)
def test_a_failed_start_of_sacbot_run_exits_with_a_message_writes_nothing_and_frees_the_lock(
        tmp_path, monkeypatch, learner_kind):
    """It used to end in a traceback; with a process learner the orphaned child then made a
    "final save" of the bot it had only loaded, and held the lock while doing so."""
    _unchecked_meta(monkeypatch)
    cfg = small_cfg(tmp_path, learner=learner_kind, env="Pendulum-v1")
    _bot_with_foreign_rng_state(cfg)
    zips = _zips(cfg.weights_dir)
    p, watch = _bot(tmp_path, UNCHECKED_META, "--learner", learner_kind, "--steps", "50")
    try:
        p.wait(timeout=100)
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode in (1, 2) and "Traceback" not in err, err[-3000:]
    assert "acting" in err, err[-3000:]
    WriterLock(cfg.weights_dir).acquire().close()  # at once: no learner of that run holds it
    assert _zips(cfg.weights_dir) == zips


# --- every wait can be interrupted -----------------------------------------------------------------
SLOW_LEARNER = """
import sys, time
from sacbot.learning.sac import SACLSTMLearner

_update = SACLSTMLearner.update


def slow_update(self, batch):
    print("slow update", file=sys.stderr, flush=True)
    time.sleep(0.4)  # a learner far slower than its game: each gradient step takes 0.4 s
    return _update(self, batch)


SACLSTMLearner.update = slow_update
"""

SLOW_BUILD = """
import sys
from sacbot.learning.training import LearnerLoop

_build = LearnerLoop._build


def slow_build(self):
    print("building", file=sys.stderr, flush=True)
    self.stop.wait(120)  # a learner that takes minutes to build (a GPU's first use, a huge replay)
    return _build(self)


LearnerLoop._build = slow_build
"""

HUNG_FINAL_WRITE = """
import sys, threading
import sacbot.learning.io_thread

_write = sacbot.learning.io_thread.write_checkpoint


def hung_write(directory, payload, *args, **kwargs):
    if payload.get("final"):
        print("final write", file=sys.stderr, flush=True)
        threading.Event().wait(120)  # a disk that hangs (an NFS server gone, a dying drive)
    return _write(directory, payload, *args, **kwargs)


sacbot.learning.io_thread.write_checkpoint = hung_write
"""

MAIN = """
if __name__ == "__main__":
    from sacbot.app.cli import main

    sys.exit(main(sys.argv[1:]))
"""


def _bot(tmp_path, patch: str, *args: str) -> tuple[subprocess.Popen, StderrWatcher]:
    """``sacbot run`` from a script that first applies ``patch``."""
    script = tmp_path / "bot.py"
    script.write_text(patch + MAIN)
    # SIGINT as a foreground shell gives it: a suite run in the background has it ignored, and an
    # ignored signal stays ignored across exec.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen([sys.executable, str(script), "run", *SMALL, "--run-dir", str(tmp_path / "run"),
                              "--weights-path", str(tmp_path / "w"), *args],
                             env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    return p, StderrWatcher(p)


def _signal_and_time(p: subprocess.Popen, sig: int, timeout: float, watch: StderrWatcher | None = None,
                     closed: str = "") -> float:
    """Seconds from ``sig`` to the bot's ``closed`` line (its work done; the interpreter's own exit,
    about a second with torch loaded, is not the bot's), or to its exit without one."""
    t0 = time.monotonic()
    p.send_signal(sig)
    took = None
    if watch is not None and closed:
        watch.wait_line(closed, timeout)
        took = time.monotonic() - t0
    p.wait(timeout=timeout)  # TimeoutExpired fails the test: the bot did not close
    return took if took is not None else time.monotonic() - t0


@pytest.mark.timeout(120)
def test_sigterm_during_a_lockstep_wait_on_a_slow_learner_closes_within_a_second(tmp_path, learner_kind):
    """observe() waited for the learner's pass (up to 600 s) without looking at the stop request,
    and the close then waited for the pass to end: 13 s with a slow learner.  Here a pass is 64
    steps of 0.4 s: 25 s."""
    p, watch = _bot(tmp_path, SLOW_LEARNER, "--learner", learner_kind, "--pace", "lockstep", "--utd-ratio", "64")
    try:
        watch.wait_line("slow update", 90)  # a pass is under way; the game waits for it in observe()
        took = _signal_and_time(p, signal.SIGTERM, 20, watch, " env steps, ")  # the closing summary
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 0, err[-3000:]
    assert took < 2.5, f"closing took {took:.1f} s"  # 0.5 s (thread) and 1.3 s (process) on 2 idle cores
    from sacbot.store.checkpoint import read_checkpoint

    meta = read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))["meta"]
    assert meta["env_steps"] >= 4  # the final save of the work up to the signal
    assert meta["utd_carry"] >= 1  # the steps the close cut short stay owed to the next run


@pytest.mark.timeout(120)
def test_sigterm_with_a_stopped_process_learner_exits_within_the_final_save_deadline(tmp_path):
    """A learner process stopped with SIGSTOP kept the bot alive past 45 s (forever, in lockstep).
    The bot now exits when --final-save-timeout runs out, says so, and the child is gone."""
    p, watch = _bot(tmp_path, "import sys\n", "--learner", "process", "--pace", "lockstep",
                    "--final-save-timeout", "2")
    learner = None
    try:
        watch.wait_line("learning started", 90)
        learner = wait_until(lambda: read_status(tmp_path / "run").get("learner_pid"), 60, "the learner's pid")
        os.kill(learner, signal.SIGSTOP)
        took = _signal_and_time(p, signal.SIGTERM, 30)
        wait_exit(learner, 10, "the stopped learner to be ended")
    finally:
        p.kill()
        if learner is not None:
            try:
                os.kill(learner, signal.SIGKILL)
            except ProcessLookupError:
                pass
    err = watch.rest(5)
    assert p.returncode == 3, err[-3000:]
    assert took < 2 + 3, f"closing took {took:.1f} s with a 2 s deadline"
    assert "not confirmed within the 2 s deadline" in err and "--final-save-timeout 2" in err, err[-3000:]
    assert "Traceback" not in err
    WriterLock(str(tmp_path / "w")).acquire().close()  # the next start is not refused


@pytest.mark.timeout(120)
def test_a_signal_while_the_final_save_hangs_on_the_disk_exits_within_the_deadline(tmp_path, learner_kind):
    """The learner runs, but its I/O thread is stuck in the final write.
    The close used to wait 300 s for it (and a process learner 30 s more after a SIGTERM)."""
    p, watch = _bot(tmp_path, HUNG_FINAL_WRITE, "--learner", learner_kind, "--pace", "lockstep",
                    "--final-save-timeout", "2")
    try:
        watch.wait_line("learning started", 90)
        took = _signal_and_time(p, signal.SIGTERM, 30)
    finally:
        p.kill()
    err = watch.rest(5)
    assert "final write" in err, err[-3000:]
    assert p.returncode == 3, err[-3000:]
    assert took < 2 + 3, f"closing took {took:.1f} s with a 2 s deadline"
    assert "not confirmed within the 2 s deadline" in err, err[-3000:]


@pytest.mark.timeout(120)
def test_sigint_while_the_learner_is_starting_exits_130_at_once_and_leaves_nothing(tmp_path, learner_kind):
    """The first wait, for the learner to build itself, looked only at its
    own 300 s timeout.  A Ctrl-C there now ends the learner unsaved and exits 130."""
    p, watch = _bot(tmp_path, SLOW_BUILD, "--learner", learner_kind, "--pace", "lockstep")
    try:
        watch.wait_line("building", 90)
        took = _signal_and_time(p, signal.SIGINT, 20, watch, "the start was interrupted")
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 128 + signal.SIGINT, err[-3000:]
    # The build would wait 120 s; what is left once it stops is 1.0 s (thread) or 0.2 s (process) on a
    # quiet machine, 3.0 s seen with both cores busy, so 10 s tells "at once" from "after the build".
    assert took < 10, f"stopping took {took:.1f} s"
    assert "interrupted" in err and "Traceback" not in err, err[-3000:]
    WriterLock(str(tmp_path / "w")).acquire().close()
    assert not _zips(tmp_path / "w")  # nothing was saved


@pytest.mark.timeout(60)
def test_a_stop_request_ends_a_lockstep_observe_that_waits_for_the_learner(tmp_path, monkeypatch):
    """The Python API: an Agent given the game's stop event returns from observe() when it is set,
    while the learner is still in its pass; close() then cuts the pass short and saves."""
    from sacbot.learning.sac import SACLSTMLearner

    in_pass = threading.Event()
    original = SACLSTMLearner.update

    def slow(self, batch):
        in_pass.set()
        time.sleep(0.2)  # each step slow: a pass of 64 is 13 s
        return original(self, batch)

    monkeypatch.setattr(SACLSTMLearner, "update", slow)
    stop = threading.Event()
    cfg = small_cfg(tmp_path, pace="lockstep", utd_ratio=64)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE, stop=stop)
    stopped_at: list[float] = []

    def stop_in_the_pass():
        if in_pass.wait(60):
            stopped_at.append(time.monotonic())
            stop.set()

    setter = threading.Thread(target=stop_in_the_pass, name="test-stopper", daemon=True)
    setter.start()
    agent.new_episode("x")
    obs = np.zeros(3, np.float32)
    for _ in range(1000):  # lockstep: each observe() waits for its pass, the first pass is 13 s
        agent.act(obs)
        agent.observe(0.0, obs, False, False)
        if stop.is_set():
            break
    final = agent.close()
    assert stopped_at, "the learner never started a pass"
    took = time.monotonic() - stopped_at[0]
    assert final["final_save"]["ok"], final["final_save"]
    assert took < 1.5, f"observe() and close() took {took:.1f} s after the stop request"
