"""One writer per weights directory: sacbot.store.lock.WriterLock, across real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from helpers import pid_alive, wait_exit

from sacbot.store.lock import LOCK_NAME, LockHeld, WriterLock

ROOT = os.path.join(os.path.dirname(__file__), "..")

# A process that takes the lock, says so, and holds it until its stdin closes.
HOLDER = """
import sys
from sacbot.store.lock import WriterLock
lock = WriterLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""

# A process that tries once and reports the outcome as its exit code and stderr.
TRY = """
import sys
from sacbot.store.lock import LockHeld, WriterLock
try:
    WriterLock(sys.argv[1]).acquire()
except LockHeld as e:
    print(f"pid={e.pid}: {e}", file=sys.stderr)
    sys.exit(3)
print("acquired")
"""


def _py(code: str, directory, *extra: str, **kw):
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, str(directory), *extra], env=env, text=True,
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
        assert os.path.exists(tmp_path / LOCK_NAME)  # never deleted (see sacbot/store/lock.py)
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


# --- a lock never crosses a fork, and its message names the real holder ---------------------------
# A bot that forks a worker (multiprocessing with the fork start method) while its Agent holds the
# lock, then closes the Agent; the worker lives on until the test closes the pipe it reads
# (argv[2]).  The bot prints the worker's PID, then waits to be killed: the worker outlives it.
FORKING_BOT = """
import multiprocessing, os, pathlib, sys
sys.path.insert(0, sys.argv[3])
from helpers import ACT_SPACE, OBS_SPACE, play, small_cfg
from sacbot import Agent


def worker(fd):
    os.read(fd, 1)  # until the test closes the other end


agent = Agent(small_cfg(pathlib.Path(sys.argv[1])), OBS_SPACE, ACT_SPACE)
play(agent, 10)
child = multiprocessing.get_context("fork").Process(target=worker, args=(int(sys.argv[2]),))
child.start()
assert agent.close()["final_save"]["ok"]
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(120)
def test_a_forked_worker_that_outlives_its_bot_does_not_hold_the_bots_lock(tmp_path):
    """The worker inherited the lock's descriptor and, with it, the flock: the bot's close freed
    nothing, and the next start was refused as "in use by process N", N the dead bot."""
    from helpers import ACT_SPACE, OBS_SPACE, small_cfg

    from sacbot import Agent

    r, w = os.pipe()
    log = tmp_path / "bot.err"
    with open(log, "w") as err:  # a file: the worker keeps the bot's stderr open
        bot = subprocess.Popen([sys.executable, "-c", FORKING_BOT, str(tmp_path), str(r), os.path.dirname(__file__)],
                               env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT)}, text=True, pass_fds=[r],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    os.close(r)
    worker = None
    try:
        line = bot.stdout.readline().strip()  # the worker keeps stdout open too: one line, no EOF
        assert line.isdigit(), log.read_text()[-3000:]
        worker = int(line)
        bot.kill()  # the bot is gone; its worker is not
        bot.wait(timeout=30)
        assert pid_alive(worker)
        agent = Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE)  # the next start
        assert agent.loaded_from is not None
        agent.close()
    finally:
        os.close(w)  # the worker's read returns: it exits
        bot.kill()
        if worker is not None:
            wait_exit(worker, 30, "the forked worker")


# A process that takes the lock, forks, closes its lock, and takes it again while the child lives;
# the child tries the lock too and reports who it was told holds it.
PLAIN_FORK = """
import os, sys
from sacbot.store.lock import LockHeld, WriterLock
lock = WriterLock(sys.argv[1]).acquire()
r, w = os.pipe()
told_r, told_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    try:
        WriterLock(sys.argv[1]).acquire()
        print("child acquired", flush=True)
    except LockHeld as e:
        print(f"child refused, holder {e.pid}", flush=True)
    os.write(told_w, b"x")
    os.read(r, 1)  # lives on until its parent has taken the lock again
    os._exit(0)
os.close(r)
os.read(told_r, 1)  # the child has tried while we hold the lock
print(f"parent {os.getpid()}", flush=True)
lock.close()
again = WriterLock(sys.argv[1]).acquire()
print("parent reacquired", flush=True)
os.close(w)
os.waitpid(pid, 0)
"""


@pytest.mark.timeout(60)
def test_a_plain_fork_child_holds_nothing_and_is_told_its_parent_holds_the_lock(tmp_path):
    """os.fork() without multiprocessing.  The child cannot take the lock
    its parent holds and is told the parent's PID (not its own process's); once the parent closes
    its lock, the parent takes it again at once though the child still runs."""
    p = subprocess.run([sys.executable, "-c", PLAIN_FORK, str(tmp_path)], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    parent = next(line.split()[1] for line in lines if line.startswith("parent "))
    assert f"child refused, holder {parent}" in lines, p.stdout
    assert "parent reacquired" in lines, p.stdout + p.stderr[-3000:]


# A process that takes the lock and hands its descriptor to a program it starts (pass_fds), then
# closes its own and exits: the program holds the lock, though the file names the first process.
HAND_OVER = """
import os, subprocess, sys
from sacbot.store.lock import WriterLock
lock = WriterLock(sys.argv[1]).acquire()
fd = lock._fd
holder = subprocess.Popen([sys.executable, "-c", "import os, sys; os.read(int(sys.argv[1]), 1)", sys.argv[2]],
                          pass_fds=[fd, int(sys.argv[2])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
lock.close()
print(os.getpid(), holder.pid, flush=True)
"""


@pytest.mark.timeout(60)
def test_the_refusal_names_the_process_that_really_holds_the_lock(tmp_path):
    """The file holds the PID of whoever took the lock; a process handed the descriptor holds it
    without writing there.  The message used to name the first process, long gone."""
    r, w = os.pipe()
    p = subprocess.run([sys.executable, "-c", HAND_OVER, str(tmp_path), str(r)], capture_output=True, text=True,
                       timeout=30, pass_fds=[r], env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT)})
    os.close(r)
    pids = p.stdout.split()
    holder = int(pids[1]) if len(pids) == 2 else None
    try:
        assert p.returncode == 0 and holder is not None, p.stderr[-3000:]
        assert open(tmp_path / LOCK_NAME).read().strip() == pids[0]  # the file names the first process
        with pytest.raises(LockHeld) as e:
            WriterLock(str(tmp_path)).acquire()
        assert e.value.pid == holder and f"process {holder}" in str(e.value), str(e.value)
    finally:
        os.close(w)  # the holder's read returns: it exits
        if holder is not None:
            wait_exit(holder, 30, "the process handed the lock")
    WriterLock(str(tmp_path)).acquire().close()  # and with it gone, the lock is free


# --- where fcntl does not exist -------------------------------------------------------------------
# Windows has no fcntl; its lock is msvcrt.locking.  These processes hide fcntl and the other
# POSIX-only calls sacbot could reach (fork, register_at_fork, pread, pwrite) and give a stand-in msvcrt
# whose byte-range lock is POSIX's lockf: the same semantics across processes (refused while held,
# freed when the holder dies), so the branch sacbot takes there runs here.  The libraries sacbot
# stands on are imported first, as they are: their own platform checks are theirs.
NO_FCNTL = """
import errno, fcntl as _real, os, sys, types
import asyncio, gymnasium, msgpack, multiprocessing, numpy, random, rich, socket, subprocess, zstandard
msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_UNLCK, msvcrt.LK_NBLCK = 0, 2
def _locking(fd, mode, nbytes):
    if mode == msvcrt.LK_UNLCK:
        _real.lockf(fd, _real.LOCK_UN, nbytes, 0, os.SEEK_CUR)
        return
    try:
        _real.lockf(fd, _real.LOCK_EX | _real.LOCK_NB, nbytes, 0, os.SEEK_CUR)
    except OSError:
        raise OSError(errno.EACCES, "Permission denied") from None  # what msvcrt raises
msvcrt.locking = _locking
sys.modules["msvcrt"] = None if "--no-msvcrt" in sys.argv else msvcrt
sys.modules["fcntl"] = None
for name in ("fork", "register_at_fork", "pread", "pwrite"):
    if hasattr(os, name):
        delattr(os, name)
"""

NO_FCNTL_HOLDER = NO_FCNTL + """
from sacbot.store.lock import WriterLock
from sacbot.store.rundir import RunDirClaim
lock = WriterLock(sys.argv[1]).acquire()
claim = RunDirClaim(sys.argv[1], sys.argv[1]).acquire()
print("locked", flush=True)
if sys.stdin.readline().strip() == "release":
    lock.close()
    claim.release()
    print("released", flush=True)
sys.stdin.read()
"""

NO_FCNTL_TRY = NO_FCNTL + """
from sacbot.store.lock import LockHeld, WriterLock
from sacbot.store.rundir import RunDirClaim, RunDirInUse
refused = []
try:
    WriterLock(sys.argv[1]).acquire()
except LockHeld as e:
    refused.append(f"lock pid={e.pid}: {e}")
try:
    RunDirClaim(sys.argv[1], sys.argv[1]).acquire()
except RunDirInUse as e:
    refused.append(f"claim pid={e.pid}: {e}")
print("\\n".join(refused) or "acquired")
"""


def _no_fcntl_try(directory) -> str:
    out, err = _py(NO_FCNTL_TRY, directory).communicate(timeout=30)
    assert not err, err
    return out.strip()


@pytest.mark.timeout(90)
def test_without_fcntl_the_lock_and_the_claim_keep_a_second_process_out_until_the_holder_releases_or_dies(tmp_path):
    first = _py(NO_FCNTL_HOLDER, tmp_path, stdin=subprocess.PIPE)
    try:
        assert first.stdout.readline().strip() == "locked", first.stderr.read()
        refused = _no_fcntl_try(tmp_path).splitlines()
        assert len(refused) == 2, refused
        assert refused[0].startswith(f"lock pid={first.pid}:") and f"process {first.pid}" in refused[0]
        assert refused[1].startswith(f"claim pid={first.pid}:") and "--run-dir" in refused[1]
        first.stdin.write("release\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "released"
        assert _no_fcntl_try(tmp_path) == "acquired"
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate(timeout=20)

    second = _py(NO_FCNTL_HOLDER, tmp_path, stdin=subprocess.PIPE)
    try:
        assert second.stdout.readline().strip() == "locked", second.stderr.read()
        assert _no_fcntl_try(tmp_path) != "acquired"
        second.send_signal(signal.SIGKILL)  # no clean-up runs: the OS must free the lock
        second.wait(timeout=20)
        assert _no_fcntl_try(tmp_path) == "acquired"
    finally:
        if second.poll() is None:
            second.kill()
        second.communicate(timeout=20)


@pytest.mark.timeout(60)
def test_a_platform_with_no_file_lock_at_all_is_told_so_and_no_lock_file_is_made(tmp_path):
    code = NO_FCNTL + """
from sacbot.store.lock import WriterLock
try:
    WriterLock(sys.argv[1]).acquire()
except OSError as e:
    print(e)
"""
    out, err = _py(code, tmp_path, "--no-msvcrt").communicate(timeout=30)
    assert "neither fcntl.flock (POSIX) nor msvcrt.locking (Windows)" in out, (out, err)
    assert not os.path.exists(tmp_path / LOCK_NAME)


@pytest.mark.timeout(120)
def test_every_module_that_acts_stores_or_serves_imports_without_posix_only_calls():
    # The base install's modules (no torch) import where fcntl and fork do not exist.
    code = NO_FCNTL + """
import importlib, pkgutil, sacbot
names = [m.name for m in pkgutil.walk_packages(sacbot.__path__, "sacbot.")
         if m.name.split(".")[1] in ("acting", "wire", "store", "config", "serve", "console")]
for name in names:
    importlib.import_module(name)
import sacbot.acting.agent, sacbot.store.lock, sacbot.serve.server  # the ones that once failed there
print(len(names), "torch" in sys.modules)
"""
    out, err = _py(code, ROOT).communicate(timeout=100)
    count, torch_loaded = out.split()
    assert int(count) >= 20 and torch_loaded == "False", (out, err)
