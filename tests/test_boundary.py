"""The learner boundary: torch-free acting, and the process learner's faults."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import StderrWatcher, read_status, wait_exit, wait_until

from sacbot.learning.process_learner import Reaper
from sacbot.store.checkpoint import read_checkpoint

pytestmark = pytest.mark.timeout(180)
SACBOT = [sys.executable, "-m", "sacbot"]
# The bots whose close these tests wait for dump every thread's stack on SIGABRT (the learner
# process inherits the flag), so a close that hangs fails with where it hangs.
SACBOT_DUMPS = [sys.executable, "-X", "faulthandler", "-m", "sacbot"]
# Loading these must not import torch: every module of the torch-free sides (import-linter checks
# their imports in the source too), and the modules a bot and the CLI load before any learner
# exists, which import the learning side only inside the functions that build one.
TORCH_FREE_PACKAGES = ("sacbot.acting", "sacbot.wire", "sacbot.store", "sacbot.config")
LOADED_BEFORE_A_LEARNER = ("sacbot.assembly.bot", "sacbot.app.cli", "sacbot.app.driver", "sacbot.app.envcheck",
                           "sacbot.learning.process_learner", "sacbot.serve.server")


def test_the_acting_side_imports_no_torch():
    code = ("import importlib, pkgutil, sys\n"
            f"mods = list({LOADED_BEFORE_A_LEARNER!r})\n"
            f"for pkg in {TORCH_FREE_PACKAGES!r}:\n"
            "    p = importlib.import_module(pkg)\n"
            "    mods += [m.name for m in pkgutil.iter_modules(p.__path__, pkg + '.')]\n"
            "for m in mods:\n"
            "    importlib.import_module(m)\n"
            "print(len(mods), sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    n, torch_modules = p.stdout.split(" ", 1)
    assert int(n) >= 25 and torch_modules.strip() == "[]", p.stdout


def test_eval_plays_the_pretrained_bot_with_torch_unimportable(tmp_path):
    """A stub `torch` earlier on sys.path raises ImportError: eval must never need it."""
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("torch is unimportable in this test")\n')
    cwd = tmp_path / "empty"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    p = subprocess.run(SACBOT + ["eval", "--episodes", "1", "--json"], capture_output=True, text=True,
                       timeout=120, cwd=cwd, env=env)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["episodes"] == 1 and summary["checkpoint"].endswith("tankduel.zip")
    written = sorted(str(f.relative_to(cwd)) for f in cwd.rglob("*") if f.is_file())
    # The heartbeat only, and the run directory's claim (sacbot/store/rundir.py): no weights, no logs.
    assert written == ["runs/default/.sacbot.run", "runs/default/status.json"]


def test_threads_that_notice_a_dead_learner_together_all_read_its_exit_code():
    """The sender, the receiver and close() may all wait for a killed child at once.  Unserialized,
    waitpid lets one of them reap it and the others read exitcode None (half the trials in a probe;
    CI once reported 'exited with code None' for a kill -9)."""
    ctx = multiprocessing.get_context("spawn")
    for _ in range(12):
        child = Reaper(ctx.Process(target=time.sleep, args=(60,)))
        child.proc.start()
        codes: list = []
        start = threading.Barrier(5)

        def wait_for_it(child=child, codes=codes, start=start):
            start.wait()
            codes.append(child.exitcode(10.0))

        threads = [threading.Thread(target=wait_for_it) for _ in range(4)]
        for t in threads:
            t.start()
        os.kill(child.proc.pid, signal.SIGKILL)
        start.wait()
        for t in threads:
            t.join(20)
        assert codes == [-signal.SIGKILL] * 4


def _wait_or_dump(p: subprocess.Popen, timeout: float) -> None:
    """Wait for the bot; past the timeout, SIGABRT its process group: each process prints its
    threads' stacks to stderr and exits, and the test's assertion shows them."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGABRT)
        p.wait(timeout=30)


def _start(tmp_path, *extra):
    args = ["run", "--learner", "process", "--env", "Pendulum-v1", "--pace", "realtime", "--tps", "200",
            "--learning-starts", "50", "--save-interval", "50", "--run-dir", str(tmp_path / "run"),
            "--weights-path", str(tmp_path / "w"), "--quiet", *extra]
    p = subprocess.Popen(SACBOT_DUMPS + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    return p, StderrWatcher(p)


def test_a_killed_learner_process_is_reported_and_the_bot_exits_non_zero_on_its_last_save(tmp_path):
    """The driver ends a run whose learner died (exit 1: a runner restarts it from the last save).
    That the Agent acts on with its last weights meanwhile is test_agent.py's
    test_learner_failure_keeps_acting_and_is_reported; here the acting thread may see the death
    before its next tick, so no tick count is asserted (a loaded machine once saw none)."""
    p, watch = _start(tmp_path)
    run = str(tmp_path / "run")
    try:
        wait_until(lambda: read_status(run).get("last_save"), 90, "a periodic save")
        st = read_status(run)
        learner_pid = st["learner_pid"]
        assert learner_pid != p.pid and st["learner"] == "process"
        os.kill(learner_pid, signal.SIGKILL)
        _wait_or_dump(p, 60)
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 1, err
    assert "learner process exited with code -9" in err and "Traceback" not in err
    st = read_status(run)
    assert not st["learner_alive"] and "code -9" in st["last_error"]
    read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))  # the last periodic save loads


def test_a_killed_bot_leaves_no_orphan_learner_and_its_work_is_saved(tmp_path):
    p, watch = _start(tmp_path)
    run = str(tmp_path / "run")
    try:
        wait_until(lambda: read_status(run)["learner_steps"] > 0, 90, "training to start")
        learner_pid = read_status(run)["learner_pid"]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        wait_exit(learner_pid, 60, f"the learner {learner_pid} to exit")
    finally:
        p.kill()
    ck = read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))  # its final save on the way out
    assert ck["meta"]["env_steps"] >= 50


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_whole_process_group_closes_with_the_final_save(tmp_path, sig):
    """systemd's stop and Ctrl-C signal the bot and its learner process together: the learner
    used to die at once (SIGTERM, no final save) or log a KeyboardInterrupt as a failure (SIGINT)."""
    args = ["run", "--learner", "process", "--env", "Pendulum-v1", "--pace", "realtime", "--tps", "200",
            "--learning-starts", "50", "--run-dir", str(tmp_path / "run"), "--weights-path", str(tmp_path / "w"),
            "--quiet"]
    p = subprocess.Popen(SACBOT_DUMPS + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line("learning started", 90)
        # A gradient step done (the first one imports what torch's optimizer needs, seconds on a
        # loaded machine): the final save then holds work, as the test asks.
        wait_until(lambda: read_status(tmp_path / "run").get("learner_steps", 0) >= 1, 90, "a gradient step")
        os.killpg(p.pid, sig)
        _wait_or_dump(p, 60)
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 0, err
    assert "failed" not in err and "Traceback" not in err
    ck = read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))
    assert ck["meta"]["grad_steps"] > 0  # the work up to the signal, not a step-0 file
