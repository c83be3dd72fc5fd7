"""The acting side wins the CPU: the learner lowers its own priority, and the acting thread's
wake-ups stay prompt while it trains beside other CPU-bound work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import ACT_SPACE, OBS_SPACE, small_cfg

from sacbot import Agent
from sacbot.config import Config

ROOT = Path(__file__).resolve().parents[1]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="niceness per thread is Linux's")


def _learner_tid(agent, kind: str) -> int:
    """The kernel's id of the learner's thread: the training thread, or the child's main thread."""
    if kind == "thread":
        (t,) = [t for t in threading.enumerate() if t.name == "sacbot-training"]
        return t.native_id
    return agent.learner.proc.pid


def _learner_nice_from_outside(agent, kind: str) -> int:
    """The learner's niceness as the kernel has it, read from this process, not from its report."""
    return os.getpriority(os.PRIO_PROCESS, _learner_tid(agent, kind))


@linux
@pytest.mark.timeout(120)
def test_the_learner_runs_below_the_acting_thread(tmp_path, learner_kind):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Agent(small_cfg(tmp_path, learner=learner_kind), OBS_SPACE, ACT_SPACE) as agent:
        expected = min(mine + agent.cfg.learner_nice, 19)
        assert agent.cfg.learner_nice == 10  # the default: acting preempts the learner
        assert _learner_nice_from_outside(agent, learner_kind) == expected
        assert agent.status()["learner_nice"] == expected  # reported as measured
        assert os.sched_getscheduler(_learner_tid(agent, learner_kind)) == os.SCHED_OTHER  # learner_idle is off
        # The acting thread, and so the game's loop, keeps its priority.
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


@linux
@pytest.mark.timeout(120)
def test_learner_idle_puts_the_learner_alone_under_sched_idle(tmp_path, learner_kind):
    mine = os.sched_getscheduler(threading.get_native_id())
    with Agent(small_cfg(tmp_path, learner=learner_kind, learner_idle=True), OBS_SPACE, ACT_SPACE) as agent:
        assert os.sched_getscheduler(_learner_tid(agent, learner_kind)) == os.SCHED_IDLE
        assert _learner_nice_from_outside(agent, learner_kind) == min(
            os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 10, 19)  # and its niceness as well
        if learner_kind == "thread":  # the threads it starts inherit the policy
            (io,) = [t for t in threading.enumerate() if t.name == "sacbot-io"]
            assert os.sched_getscheduler(io.native_id) == os.SCHED_IDLE
        assert os.sched_getscheduler(threading.get_native_id()) == mine  # acting keeps its policy


@linux
@pytest.mark.timeout(120)
def test_learner_nice_0_keeps_the_bots_priority(tmp_path, learner_kind):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Agent(small_cfg(tmp_path, learner=learner_kind, learner_nice=0), OBS_SPACE, ACT_SPACE) as agent:
        assert _learner_nice_from_outside(agent, learner_kind) == mine
        assert agent.status()["learner_nice"] == mine


@linux
@pytest.mark.timeout(120)
def test_threads_the_thread_learner_starts_inherit_its_priority(tmp_path):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Agent(small_cfg(tmp_path, learner="thread", learner_nice=3), OBS_SPACE, ACT_SPACE):
        io = [t for t in threading.enumerate() if t.name == "sacbot-io"]
        assert io, "the I/O thread is started by the learner"
        assert os.getpriority(os.PRIO_PROCESS, io[0].native_id) == min(mine + 3, 19)


@pytest.mark.parametrize("value", ["-1", "20", "ten"])
@pytest.mark.timeout(60)
def test_a_learner_nice_out_of_range_is_refused_by_name(value, tmp_path):
    r = subprocess.run([sys.executable, "-m", "sacbot", "run", "--learner-nice", value, "--steps", "1",
                        "--run-dir", str(tmp_path / "r"), "--weights-path", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "learner-nice" in r.stderr or "learner_nice" in r.stderr
    assert not (tmp_path / "w").exists()


@linux
@pytest.mark.alone
@pytest.mark.timeout(240)
def test_the_acting_thread_is_not_kept_waiting_while_the_thread_learner_trains():
    """A probe on the acting thread sleeps 1 ms again and again while the thread learner trains flat
    out, with CPU-bound processes beside the bot so that one more thread wants a core than there
    are cores (tools/bench/gil.py at smoke size).  At the bot's own priority the learner kept it
    from a core for a whole scheduler tick (~4 ms) 14-21 times a second on a 2-core machine; at the
    default 1-4 times.  Compared side by side in one run, so a faster or busier machine moves both
    arms; the bound is the ratio, which the learner at the bot's priority (the code before the fix)
    cannot meet."""
    nice = Config().learner_nice
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "gil.py"), "--seconds", "5", "--repeats", "1",
                        "--load", str(max(1, cores - 1)), "--nice", "0", str(nice)],
                       capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    base, default = out["arms"]["0"], out["arms"][str(nice)]
    print(json.dumps(out["arms"]))  # the figure, in the test's output
    # No bound on the GIL waits alone: they are a lone absolute time on a shared machine (0.7-3.3 ms
    # a second measured here). The late wake-ups below count them with the CPU waits, and a learner
    # that held the GIL for whole switch intervals would make both arms late alike (priority does not
    # move the GIL), which the ratio refuses.
    # Late wake-ups (> 1 ms): at most half of what the same learner at the bot's own priority
    # causes (measured 0.1-0.2 of it), or under 2 a second where that arm itself had few.
    assert default["late_over_1ms_per_s"] <= max(0.5 * base["late_over_1ms_per_s"], 2.0), (default, base)


@pytest.mark.parametrize("nice, idle, warned", [(10, False, True), (0, True, True), (0, False, False)])
def test_a_priority_that_cannot_be_applied_is_warned_of(monkeypatch, caplog, nice, idle, warned):
    # A platform without os.setpriority (Windows): the settings promise a warning, not silence.
    from sacbot.learning import priority

    monkeypatch.delattr(priority.os, "setpriority")
    with caplog.at_level("WARNING", logger="sacbot"):
        assert priority.yield_cpu_to_acting(nice, idle) is None
    said = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert bool(said) == warned
    if warned:
        assert ("learner_idle" in said[0]) == idle and (f"learner_nice {nice}" in said[0]) == (nice > 0)


def test_a_thread_learner_where_niceness_is_per_process_is_warned_of(monkeypatch, caplog):
    # macOS and the BSDs keep niceness per process: lowering it from the learner's thread would
    # slow acting too, so it is not done, and the user is told why.
    from sacbot.learning import priority

    monkeypatch.setattr(priority.sys, "platform", "darwin")
    calls: list = []
    monkeypatch.setattr(priority.os, "setpriority", lambda *a: calls.append(a), raising=False)
    result: list = []
    with caplog.at_level("WARNING", logger="sacbot"):
        t = threading.Thread(target=lambda: result.append(priority.yield_cpu_to_acting(10)), name="learner-like")
        t.start()
        t.join(10)
    assert result == [None] and calls == []
    assert any("--learner process" in r.getMessage() for r in caplog.records)
