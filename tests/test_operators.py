"""Operators are told: a file the bot cannot write is logged once with its path
and error; two bots are never let into one run directory."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest
from helpers import ACT_SPACE, OBS_SPACE, StderrWatcher, play, small_cfg, wait_exit

from sacbot import Agent
from sacbot.acting.agent import AgentError
from sacbot.config import ConfigError

pytestmark = pytest.mark.timeout(120)


def said(caplog, path) -> list[str]:
    """The sacbot warnings that name ``path``."""
    return [r.getMessage() for r in caplog.records
            if r.name == "sacbot" and r.levelno >= logging.WARNING and repr(str(path)) in r.getMessage()]


# --- a failed write is logged once, with its path and error -----------------------------------
def test_a_round_counter_that_cannot_be_written_is_logged_once(tmp_path, caplog):
    """A runner saw a frozen bot, and nothing in its log said why."""
    cfg = small_cfg(tmp_path)
    counter = tmp_path / "w" / "round_counter.txt"
    counter.mkdir(parents=True)  # a directory in its place: every bump fails
    with caplog.at_level(logging.WARNING, logger="sacbot"), Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 40)  # 4 episodes, 4 failed bumps
        assert agent.episodes == 4
    lines = said(caplog, counter)
    assert len(lines) == 1 and "the round counter" in lines[0] and "IsADirectoryError" in lines[0], lines


def test_a_heartbeat_that_cannot_be_written_is_logged_once(tmp_path, caplog):
    cfg = small_cfg(tmp_path)
    status = tmp_path / "run" / "status.json"
    status.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="sacbot"):
        with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
            play(agent, 20)  # the first tick's write fails, and the close's forced one
    lines = said(caplog, status)
    assert len(lines) == 1 and "the heartbeat" in lines[0] and "IsADirectoryError" in lines[0], lines


def test_save_receipts_that_cannot_be_written_are_logged_once(tmp_path, caplog):
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=5)
    receipts = tmp_path / "w" / "saves.jsonl"
    receipts.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="sacbot"):
        with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
            play(agent, 40)  # ~36 gradient steps: periodic saves, then the final one
        assert agent.final_save["ok"]  # the checkpoints themselves were written
    lines = said(caplog, receipts)
    assert len(lines) == 1 and "IsADirectoryError" in lines[0], lines


def test_a_full_run_directory_is_logged_once_per_file_and_error(tmp_path, caplog, monkeypatch):
    """ENOSPC on every write into the run directory: the heartbeat (atomic: temp, then rename) and
    the episodes log (append) are each said once, with the error."""
    from sacbot.store.liveness import flush_heartbeats

    cfg = small_cfg(tmp_path)
    run = str(tmp_path / "run")
    real_replace, real_open = os.replace, open

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    def replace(src, dst, *a, **k):
        return full() if os.path.dirname(os.path.abspath(dst)) == run else real_replace(src, dst, *a, **k)

    def opener(file, mode="r", *a, **k):
        if "a" in mode and os.path.dirname(os.path.abspath(str(file))) == run:
            full()
        return real_open(file, mode, *a, **k)

    with caplog.at_level(logging.WARNING, logger="sacbot"):
        with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
            monkeypatch.setattr(os, "replace", replace)
            monkeypatch.setattr("builtins.open", opener)
            play(agent, 30)
            flush_heartbeats(os.path.join(run, "status.json"))  # its writer's thread has met the full disk
            monkeypatch.undo()
    for name in ("status.json", "episodes.jsonl"):
        lines = said(caplog, os.path.join(run, name))
        assert len(lines) == 1 and "No space left on device" in lines[0], (name, lines)


def test_a_heartbeat_whose_disk_hangs_keeps_no_tick_waiting_and_is_written_once_the_disk_answers(
        tmp_path, monkeypatch):
    """status.json's rename took 0.2-1.2 ms on the acting thread once a second, per bot: a server's
    loop acting for 32 games paid 32 a second between steps.  Here the rename hangs until released:
    every tick still returns, and the newest status lands once the disk answers."""
    from sacbot.store.liveness import flush_heartbeats

    cfg = dataclasses.replace(small_cfg(tmp_path), learner="thread")
    status = str(tmp_path / "run" / "status.json")
    real_replace, disk, hung = os.replace, threading.Event(), threading.Event()

    def replace(src, dst, *a, **k):
        if os.path.abspath(dst) == status:
            hung.set()
            disk.wait(60)  # the test's timeout ends a tick that wrongly waits here
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    try:
        play(agent, 25)  # the first tick hands its status to the writer, which hangs in the rename
        assert hung.wait(30) and not disk.is_set()
        assert agent.ticks == 25 and not os.path.exists(status)
        assert not flush_heartbeats(status, timeout=0.2)  # still hanging
        disk.set()
        assert flush_heartbeats(status, timeout=30)
        assert json.loads(open(status).read())["ticks"] >= 1
    finally:
        disk.set()
        agent.close()
    assert json.loads(open(status).read())["ticks"] == 25  # close writes the last one and waits for it


def test_training_metrics_that_cannot_be_written_are_logged_once_not_per_pass(tmp_path, caplog):
    cfg = small_cfg(tmp_path, pace="lockstep")
    metrics = tmp_path / "run" / "training_metrics.jsonl"
    metrics.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="sacbot"):
        with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
            play(agent, 30)  # a pass per env step in lockstep: 30 failed lines
    lines = said(caplog, metrics)
    assert len(lines) == 1 and "IsADirectoryError" in lines[0], lines


def test_a_file_is_said_once_per_kind_of_error_and_again_after_it_worked(caplog):
    from sacbot.store.files import write_failed, write_ok

    path = "/nowhere/status.json"
    with caplog.at_level(logging.INFO, logger="sacbot"):
        for _ in range(3):
            write_failed(path, OSError(errno.ENOSPC, "No space left on device"), "the heartbeat")
        write_failed(path, PermissionError(errno.EACCES, "Permission denied"), "the heartbeat")
        write_ok(path)
        write_ok(path)
        write_failed(path, OSError(errno.ENOSPC, "No space left on device"), "the heartbeat")
    msgs = [r.getMessage() for r in caplog.records if path in r.getMessage()]
    assert [("ENOSPC" if "No space" in m else "EACCES" if "denied" in m else "ok") for m in msgs] == \
        ["ENOSPC", "EACCES", "ok", "ENOSPC"], msgs


# --- one bot per run directory ----------------------------------------------------------------
def test_a_second_bot_in_a_run_directory_is_refused_naming_the_first_and_a_third_too(tmp_path):
    """Only --weights-path differed: their metrics interleaved, their episodes mixed, and
    status.json was whichever wrote last."""
    cfg = small_cfg(tmp_path)
    first = Agent(cfg, OBS_SPACE, ACT_SPACE)
    try:
        for other in ("w2", "w3"):
            with pytest.raises(ConfigError, match=r"--run-dir '.*run' is in use by another Agent in this same "
                                                  r"process, the bot of weights '.*/w': two bots in one run "
                                                  r"directory would interleave .* its own --run-dir"):
                Agent(dataclasses.replace(cfg, weights_path=str(tmp_path / other)), OBS_SPACE, ACT_SPACE)
            assert not (tmp_path / other).exists()  # refused before anything of it was made
        # The same bot started twice is not a setting to change: exit 1, as for its weights.
        with pytest.raises(AgentError, match="is in use by another Agent in this same process.*Stop that bot first"):
            Agent(cfg, OBS_SPACE, ACT_SPACE)
        play(first, 12)  # the refusals took nothing of the first's
    finally:
        first.close()
    with Agent(dataclasses.replace(cfg, weights_path=str(tmp_path / "w3")), OBS_SPACE, ACT_SPACE) as third:
        play(third, 2)  # free once the first has closed


def test_an_eval_shares_no_run_directory_with_a_training_bot(tmp_path):
    cfg = small_cfg(tmp_path)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 12)  # a checkpoint to evaluate
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        with pytest.raises(AgentError, match="in use by another Agent in this same process"):
            Agent(dataclasses.replace(cfg, eval_mode=True), OBS_SPACE, ACT_SPACE)  # it writes status.json
        play(agent, 2)
    with Agent(dataclasses.replace(cfg, eval_mode=True), OBS_SPACE, ACT_SPACE) as evaluating:
        play(evaluating, 2)


def test_a_run_directory_whose_claim_cannot_be_written_is_refused_at_start(tmp_path):
    cfg = small_cfg(tmp_path)
    (tmp_path / "run" / ".sacbot.run").mkdir(parents=True)
    with pytest.raises(AgentError, match=r"--run-dir '.*run' cannot be written \('.*\.sacbot\.run': Is a directory\)"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_keep_the_run_directory(tmp_path):
    """A game's fork after its Agent was made: the child's copy of the claim would keep the run
    directory held after the parent closed."""
    cfg = small_cfg(tmp_path)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait until told, touch nothing
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        agent.close()
        with Agent(dataclasses.replace(cfg, weights_path=str(tmp_path / "w2")), OBS_SPACE, ACT_SPACE):
            pass  # the child still runs, and the run directory is free
    finally:
        os.close(w)  # the child reads EOF and exits
        wait_exit(pid, 30, "the forked child")
        os.waitpid(pid, 0)


def test_two_sacbot_runs_on_one_run_directory_the_second_exits_2_naming_the_first(tmp_path):
    base = [sys.executable, "-m", "sacbot", "run", "--env", "Pendulum-v1", "--hidden", "8", "--batch-size", "4",
            "--seq-len", "4", "--learning-starts", "16", "--pace", "lockstep", "--run-dir", str(tmp_path / "run")]
    first = subprocess.Popen(base + ["--weights-path", str(tmp_path / "a")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(first)
    try:
        watch.wait_line("learning started", 90)
        second = subprocess.run(base + ["--weights-path", str(tmp_path / "b"), "--steps", "50", "--quiet"],
                                capture_output=True, text=True, timeout=90)
        first.send_signal(signal.SIGTERM)
        first.wait(60)
    finally:
        first.kill()
    assert second.returncode == 2, second.stderr
    assert f"is in use by process {first.pid}, the bot of weights {str(tmp_path / 'a')!r}" in second.stderr
    assert "Traceback" not in second.stderr and not (tmp_path / "b").exists()
    assert first.returncode == 0, watch.rest(5)
