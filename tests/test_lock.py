"""One writer per weights directory: sacbot.lock.WriterLock, across real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sacbot.lock import LOCK_NAME, LockHeld, WriterLock

ROOT = os.path.join(os.path.dirname(__file__), "..")

# A process that takes the lock, says so, and holds it until its stdin closes.
HOLDER = """
import sys
from sacbot.lock import WriterLock
lock = WriterLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""

# A process that tries once and reports the outcome as its exit code and stderr.
TRY = """
import sys
from sacbot.lock import LockHeld, WriterLock
try:
    WriterLock(sys.argv[1]).acquire()
except LockHeld as e:
    print(f"pid={e.pid}: {e}", file=sys.stderr)
    sys.exit(3)
print("acquired")
"""


def _py(code: str, directory, **kw):
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, str(directory)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _try(directory) -> subprocess.CompletedProcess:
    p = _py(TRY, directory)
    out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _holder(directory) -> subprocess.Popen:
    p = _py(HOLDER, directory, stdin=subprocess.PIPE)
    assert p.stdout.readline().strip() == "locked", p.stderr.read()
    return p


@pytest.mark.timeout(60)
def test_a_second_process_is_refused_naming_the_holder_and_a_killed_holder_frees_the_lock(tmp_path):
    first = _holder(tmp_path)
    try:
        r = _try(tmp_path)
        assert r.returncode == 3, r
        assert f"pid={first.pid}:" in r.stderr and f"process {first.pid}" in r.stderr
        assert str(tmp_path) in r.stderr and "--weights-path" in r.stderr
        first.send_signal(signal.SIGKILL)  # no clean-up runs: the OS must release the flock
        first.wait(timeout=20)
        r = _try(tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == "acquired", r
        assert os.path.exists(tmp_path / LOCK_NAME)  # never deleted (see sacbot/lock.py)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate(timeout=20)


@pytest.mark.timeout(60)
def test_the_lock_is_released_on_close_and_by_the_context_manager(tmp_path):
    with WriterLock(str(tmp_path)) as lock:
        assert lock.held
        assert open(tmp_path / LOCK_NAME).read().strip() == str(os.getpid())
        assert _try(tmp_path).returncode == 3
    assert not lock.held
    assert _try(tmp_path).returncode == 0
    again = WriterLock(str(tmp_path)).acquire()
    again.close()
    again.close()  # closing twice is harmless
    assert _try(tmp_path).returncode == 0


def test_two_locks_in_one_process_conflict_too(tmp_path):
    # Two Agents in one process on one directory are two writers as well.
    with WriterLock(str(tmp_path)):
        with pytest.raises(LockHeld, match="another Agent \\(or learner\\) in this same process") as e:
            WriterLock(str(tmp_path)).acquire()
        assert isinstance(e.value, RuntimeError) and e.value.pid == os.getpid()


def test_a_missing_directory_is_an_os_error_not_a_lock_conflict(tmp_path):
    with pytest.raises(FileNotFoundError):
        WriterLock(str(tmp_path / "nope")).acquire()
