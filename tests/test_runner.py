"""Training runner, with real subprocesses and hard timeouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import StderrWatcher, dir_digests

from sacbot.store.checkpoint import read_checkpoint

FAKE = [sys.executable, os.path.join(os.path.dirname(__file__), "fake_bot.py")]
RUNNER = [sys.executable, "-m", "sacbot", "runner"]


def start_runner(root, *flags, bot_args=()):
    cmd = RUNNER + ["--root", str(root), "--bot-cmd", " ".join(FAKE), "--backoff", "0.1", *flags, "--", *bot_args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, StderrWatcher(p)


def events(root):
    with open(os.path.join(root, "runner_events.jsonl")) as fh:
        return [json.loads(x) for x in fh]


@pytest.mark.timeout(60)
def test_a_frozen_bot_is_detected_in_time_and_restarted(tmp_path):
    # With no grace the freeze clock starts at launch, so the timeout must outlast the fake bot's
    # start-up (a Python with numpy, seconds on a loaded 2-core machine): 3 s, not 1.
    p, watch = start_runner(tmp_path, "--freeze-timeout", "3.0", "--grace", "0", "--kill-grace", "2",
                            bot_args=["--mode", "freeze", "--after", "3"])
    try:
        watch.wait_line("runner: frozen bot0", 30)
        counter = tmp_path / "bot0" / "weights" / "round_counter.txt"
        last_bump = os.path.getmtime(counter)
        watch.wait_line("runner: restarted bot0", 30)
        p.send_signal(signal.SIGTERM)
        p.wait(20)
    finally:
        p.kill()
    frozen = next(e for e in events(tmp_path) if e["event"] == "frozen")
    assert frozen["rounds"] == 3, frozen
    # The runner sees the last bump up to one poll (0.5 s) late and the freeze up to one poll
    # late: the timeout + 1 s, and 1 s more for a loaded machine's late wake-ups.
    late = frozen["time"] - last_bump
    assert late <= 3.0 + 1.0 + 1.0, f"frozen {late:.2f} s after the last round (timeout 3 s)"


@pytest.mark.timeout(60)
def test_a_crashing_bot_is_restarted_and_one_that_keeps_crashing_makes_the_runner_give_up(tmp_path):
    p, watch = start_runner(tmp_path, "--max-restarts", "2", bot_args=["--mode", "crash", "--after", "2"])
    try:
        watch.wait_line("runner: crashed bot0", 30)
        watch.wait_line("runner: restarted bot0", 30)
        p.wait(40)
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 1 and "giving up: bot0 needed more than 2 restarts" in err
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds.count("crashed") == 3 and kinds.count("restarted") == 2 and kinds[-1] == "gave_up"
    rounds = int((tmp_path / "bot0" / "weights" / "round_counter.txt").read_text())
    assert rounds == 6  # 2 rounds per life, the counter continuing across restarts


@pytest.mark.timeout(60)
def test_a_bot_that_rejects_its_configuration_stops_the_runner_without_restarts(tmp_path):
    bot = [sys.executable, "-m", "sacbot", "run"]
    p = subprocess.run(RUNNER + ["--root", str(tmp_path), "--bot-cmd", " ".join(bot), "--backoff", "0.1",
                                 "--", "--device", "gpu0"], capture_output=True, text=True, timeout=50)
    assert p.returncode == 2  # the campaign's settings are wrong, as for sacbot run itself
    assert "bot0 rejected its configuration (exit code 2)" in p.stderr and "device = 'gpu0'" in p.stderr
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds == ["started", "config_error", "gave_up"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (["--freeze-timeout", "nan"], "--freeze-timeout must be a finite number > 0"),  # freezes never detected
    (["--backoff", "inf"], "--backoff must be a finite number >= 0"),
    (["--root", ""], "--root '' is not accepted: expected a directory"),
    (["--root", "FILE"], "is not accepted: expected a directory"),
    (["--", "--weights-path", "x"], "--weights-path is set by the runner for each bot"),
])
def test_the_runner_refuses_bad_flags_by_name_before_starting_a_bot(tmp_path, args, says):
    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / "FILE") if x == "FILE" else x for x in args]
    root = [] if "--root" in args else ["--root", str(tmp_path / "camp")]
    p = subprocess.run(RUNNER + root + args, capture_output=True, text=True, timeout=50)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["FILE"]  # no bot started, nothing made


@pytest.mark.timeout(120)
def test_sigterm_to_the_runner_closes_every_real_bot_with_a_final_checkpoint(tmp_path):
    bot = [sys.executable, "-m", "sacbot", "run"]
    cmd = RUNNER + ["--root", str(tmp_path), "--bots", "2", "--bot-cmd", " ".join(bot), "--stop-deadline", "30",
                    "--", "--env", "Pendulum-v1", "--hidden", "16", "--learning-starts", "64"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line("runner: alive bot", 60)
        watch.wait_line("runner: alive bot", 60)  # both bots have finished a round
        p.send_signal(signal.SIGTERM)
        p.wait(40)
    finally:
        p.kill()
    assert p.returncode == 0, watch.rest(5)
    for i in (0, 1):
        ck = read_checkpoint(str(tmp_path / f"bot{i}" / "weights" / "sac_latest.zip"))
        assert ck["meta"]["env_steps"] >= 200
    assert [e["event"] for e in events(tmp_path)][-1] == "stopped"


@pytest.mark.timeout(120)
def test_eval_never_writes_weights_nor_touches_the_buffer(tmp_path):
    w, run = str(tmp_path / "w"), str(tmp_path / "run")
    base = ["--env", "Pendulum-v1", "--hidden", "16", "--weights-path", w, "--run-dir", run, "--quiet"]
    r = subprocess.run([sys.executable, "-m", "sacbot", "run", "--pace", "lockstep", "--steps", "300",
                        "--learning-starts", "64", *base], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr

    before = dir_digests(w)
    replay_before = read_checkpoint(os.path.join(w, "sac_latest.zip"))["arrays"]["replay.obs"].copy()
    r = subprocess.run([sys.executable, "-m", "sacbot", "eval", "--episodes", "2", "--json", *base],
                       capture_output=True, text=True, timeout=100, env={**os.environ, "SACBOT_EVAL_MODE": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["episodes"] == 2 and "EVAL MODE" in r.stderr
    assert dir_digests(w) == before
    assert (read_checkpoint(os.path.join(w, "sac_latest.zip"))["arrays"]["replay.obs"] == replay_before).all()


@pytest.mark.timeout(150)
def test_periodic_eval_appends_results_and_keeps_best_zip(tmp_path):
    bot = [sys.executable, "-m", "sacbot", "run"]
    cmd = RUNNER + ["--root", str(tmp_path), "--bot-cmd", " ".join(bot), "--eval-every-rounds", "2",
                    "--eval-episodes", "1", "--", "--env", "Pendulum-v1", "--hidden", "16", "--learning-starts", "64",
                    "--save-interval", "10", "--pace", "lockstep"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line("runner: new_best bot0", 120)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        p.kill()
    with open(tmp_path / "bot0" / "run" / "evals.jsonl") as fh:
        first = json.loads(fh.readline())
    assert first["episodes"] == 1 and first["rounds"] >= 2 and first["mean_return"] < 0
    best = read_checkpoint(str(tmp_path / "bot0" / "best.zip"))
    assert best["manifest"]["step"] > 0


def test_status_table_says_live_stale_or_missing(tmp_path):
    import time

    from sacbot.app.status import format_status

    text, code = format_status(str(tmp_path))
    assert code == 1 and "no heartbeat" in text
    st = {"pid": 1, "time": time.time(), "started": time.time() - 120, "mode": "train", "ticks": 10,
          "episodes": 2, "learner_steps": 5, "policy_version": 6, "buffer_size": 10,
          "drops": {"transition": 3, "other": 0, "save": 1}, "last_save": None, "last_error": None}
    (tmp_path / "status.json").write_text(json.dumps(st))
    text, code = format_status(str(tmp_path))
    assert code == 0 and "live" in text and "transition 3" in text and "2.0 min" in text
    st["time"] -= 60
    (tmp_path / "status.json").write_text(json.dumps(st))
    text, code = format_status(str(tmp_path))
    assert code == 1 and "STALE" in text
    # A run that closed stops its heartbeat on purpose: finished, not stale; exit 1 only if its
    # final save failed.
    st.update(closed=True, final_save={"ok": True, "path": "w/sac_latest.zip", "time": st["time"]})
    (tmp_path / "status.json").write_text(json.dumps(st))
    text, code = format_status(str(tmp_path))
    assert code == 0 and "finished (60" in text and "final save      w/sac_latest.zip" in text, text
    st["final_save"] = {"ok": False, "error": "disk full"}
    (tmp_path / "status.json").write_text(json.dumps(st))
    text, code = format_status(str(tmp_path))
    assert code == 1 and "FINAL SAVE FAILED" in text and "failed: disk full" in text, text


@pytest.mark.timeout(120)
def test_eval_runs_n_episodes_per_opponent_of_the_schedule(tmp_path):
    env = ["--env", "sacbot/TankDuel-v0", "--env-kwargs",
           '{"opponents": ["sitting_duck", "spinner"], "schedule": "cycle", "max_ticks": 20}', "--hidden", "16",
           "--weights-path", str(tmp_path / "w"), "--run-dir", str(tmp_path / "run"), "--quiet"]
    r = subprocess.run([sys.executable, "-m", "sacbot", "run", "--steps", "100", "--learning-starts", "50", *env],
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "sacbot", "eval", "--episodes-per-opponent", "3", "--json", *env],
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    per = json.loads(r.stdout)["per_opponent"]
    assert {k: v["episodes"] for k, v in per.items()} == {"sitting_duck": 3, "spinner": 3}


# --- the runner survives its own I/O errors and forgives old crashes ------------------------
# The runner with shutil.copyfile failing as on a full disk (ENOSPC); the bots' own files are fine.
FULL_DISK_RUNNER = [sys.executable, "-c",
                    "import errno, shutil, sys\n"
                    "def full(*a, **k):\n"
                    "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
                    "shutil.copyfile = full\n"
                    "from sacbot.app.runner import main\n"
                    "sys.exit(main(sys.argv[1:]))"]
EVAL = " ".join(FAKE + ["--eval-result", "1.5"])


def _run_until(cmd, line, timeout=60):
    """Start the runner, wait for a stderr line, SIGTERM it; returns (exit code, all of stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line(line, timeout)
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    finally:
        p.kill()
    return p.returncode, watch.rest(5)


@pytest.mark.timeout(90)
def test_a_full_disk_while_copying_for_eval_is_an_event_and_the_bots_go_on(tmp_path):
    """ENOSPC from the eval copy was a traceback out of the runner: every bot stopped, no stopped
    event, no summary."""
    cmd = FULL_DISK_RUNNER + ["--root", str(tmp_path), "--bot-cmd", " ".join(FAKE), "--eval-every-rounds", "2",
                              "--eval-cmd", EVAL, "--", "--latest", "--period", "0.1"]
    code, err = _run_until(cmd, "runner: io_error bot0")
    assert code == 0 and "Traceback" not in err, err
    ev = events(tmp_path)
    bad = next(e for e in ev if e["event"] == "io_error")
    assert bad["error"].startswith("ENOSPC") and bad["path"].endswith(os.path.join("bot0", "eval", "sac_latest.zip"))
    assert "copying the checkpoint for eval" in bad["doing"]
    assert ev[-1]["event"] == "stopped" and ev[-1]["bots"][0]["restarts"] == 0
    assert (tmp_path / "bot0" / "weights" / "final_save.txt").exists()  # closed by the runner, not lost
    assert not (tmp_path / "bot0" / "eval" / "sac_latest.zip").exists()


@pytest.mark.timeout(90)
def test_a_best_zip_that_cannot_be_written_is_an_event_and_the_runner_goes_on(tmp_path):
    (tmp_path / "bot0" / "best.zip").mkdir(parents=True)  # a directory in its place
    p, watch = start_runner(tmp_path, "--eval-every-rounds", "2", "--eval-cmd", EVAL,
                            bot_args=["--latest", "--period", "0.1"])
    try:
        watch.wait_line("runner: io_error bot0", 60)
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 0 and "Traceback" not in err, err
    ev = events(tmp_path)
    bad = next(e for e in ev if e["event"] == "io_error")
    assert "writing the new best" in bad["doing"] and bad["path"].endswith("best.zip")
    assert not any(e["event"] == "new_best" for e in ev) and ev[-1]["event"] == "stopped"
    with open(tmp_path / "bot0" / "run" / "evals.jsonl") as fh:  # the eval itself is kept
        assert json.loads(fh.readline())["mean_return"] == 1.5


@pytest.mark.timeout(90)
def test_a_bot_log_that_cannot_be_opened_is_an_event_and_the_bot_still_runs(tmp_path):
    (tmp_path / "bot0" / "bot.log").mkdir(parents=True)
    code, err = _run_until(start_cmd(tmp_path), "runner: alive bot0")
    assert code == 0 and "Traceback" not in err, err
    ev = events(tmp_path)
    bad = next(e for e in ev if e["event"] == "io_error")
    assert "opening the bot's log" in bad["doing"] and bad["error"].startswith("EISDIR")
    assert [e["event"] for e in ev][-1] == "stopped"


def start_cmd(root, *flags, bot_args=()):
    return RUNNER + ["--root", str(root), "--bot-cmd", " ".join(FAKE), "--backoff", "0.1", *flags, "--", *bot_args]


@pytest.mark.timeout(90)
def test_an_events_file_that_cannot_be_written_is_said_once_and_the_runner_goes_on(tmp_path):
    (tmp_path / "runner_events.jsonl").mkdir()
    code, err = _run_until(start_cmd(tmp_path, "--bots", "2"), "runner: alive bot")
    assert code == 0 and "Traceback" not in err, err
    said = [x for x in err.splitlines() if "cannot write" in x and "runner_events.jsonl" in x]
    assert len(said) == 1 and "IsADirectoryError" in said[0], err  # started x2, alive, stopped: said once


def _runner(tmp_path, *flags):
    from sacbot.app.runner import Runner, parser

    return Runner(parser().parse_args(["--root", str(tmp_path), "--quiet", *flags]))


def test_crashes_spread_over_weeks_are_forgiven_and_a_burst_still_gives_up(tmp_path):
    """The restart count was a lifetime count: a few crashes spread over weeks stopped a bot for good."""
    r = _runner(tmp_path, "--max-restarts", "2", "--restart-window", "3600", "--backoff", "1")
    b = r.bots[0]
    for day in range(10):
        r.schedule_restart(b, day * 86400.0, "exit code 3")
        assert r.failed is None, r.failed
        assert b.next_start == day * 86400.0 + 1.0  # the backoff starts over too
    assert b.restarts == 10  # still counted, for the summary
    burst = 100 * 86400.0
    for k in range(3):
        r.schedule_restart(b, burst + k, "exit code 3")
    assert r.failed == "bot0 needed more than 2 restarts within 3600 s (last: exit code 3)"


def test_a_restart_counts_against_the_limit_for_exactly_the_window(tmp_path):
    r = _runner(tmp_path, "--max-restarts", "1", "--restart-window", "60")
    b = r.bots[0]
    r.schedule_restart(b, 0.0, "x")
    r.schedule_restart(b, 60.0, "x")  # the first is 60 s old: forgiven
    assert r.failed is None
    r.schedule_restart(b, 119.99, "x")  # the one at 60 s still counts
    assert r.failed is not None and "more than 1 restarts within 60 s" in r.failed


@pytest.mark.timeout(60)
def test_the_restart_window_must_be_a_positive_number_of_seconds(tmp_path):
    p = subprocess.run(RUNNER + ["--root", str(tmp_path / "c"), "--restart-window", "0"], capture_output=True,
                       text=True, timeout=50)
    assert p.returncode == 2 and "--restart-window must be a finite number > 0" in p.stderr, p.stderr


# The runner with a fault of its own (not an I/O error) once bot0 has finished a round.
FAULTY_RUNNER = [sys.executable, "-c",
                 "import os, sys\n"
                 "import sacbot.app.runner as r\n"
                 "def fault(path):\n"
                 "    bot = os.path.dirname(os.path.dirname(path))\n"
                 "    if os.path.exists(os.path.join(bot, 'weights', 'round_counter.txt')):\n"
                 "        raise RuntimeError('injected fault')\n"
                 "r.read_status = fault\n"
                 "sys.exit(r.main(sys.argv[1:]))"]


@pytest.mark.timeout(90)
def test_a_fault_of_the_runner_itself_still_stops_the_bots_and_writes_the_summary(tmp_path):
    p = subprocess.run(FAULTY_RUNNER + ["--root", str(tmp_path), "--bot-cmd", " ".join(FAKE), "--",
                                        "--period", "0.1"], capture_output=True, text=True, timeout=80)
    assert p.returncode == 1 and "giving up: the runner failed: RuntimeError: injected fault" in p.stderr, p.stderr
    last = events(tmp_path)[-1]
    assert last["event"] == "gave_up" and last["bots"][0]["bot"] == 0
    assert (tmp_path / "bot0" / "weights" / "final_save.txt").exists()  # closed by stop_all, with its save
