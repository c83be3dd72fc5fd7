"""Helpers shared by the tests."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import queue
import threading
import time


class StderrWatcher:
    """Reads a child's stderr on a thread; ``wait_line`` blocks on a queue until a line
    containing ``needle`` arrives, with a hard deadline.  The child's own message is the
    synchronisation, not a sleep."""

    def __init__(self, proc):
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self._t = threading.Thread(target=self._read, args=(proc.stderr,), name="test-stderr", daemon=True)
        self._t.start()

    def _read(self, fh):
        for line in fh:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no stderr line with {needle!r}; got {''.join(self.seen)[-2000:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"child exited before {needle!r}: {''.join(self.seen)[-2000:]}")
            self.seen.append(line)
            if needle in line:
                return line

    def rest(self, timeout):
        self._t.join(timeout)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


def load_tool(name: str):
    """The module of ``tools/<name>.py``: tools/ is not a package on pytest's path."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dir_digests(d) -> dict[str, str]:
    """sha256 of every file in a directory, by name: to show that a step changed no file.  The writer
    lock's file is left out: it holds the PID of whoever last took the lock, not data."""
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in sorted(os.listdir(d))
            if f != ".sacbot.lock"}


# --- a tiny bot on a 3-d observation, 1-d action game, for Agent-level tests ---------------
def _spaces():
    import gymnasium as gym
    import numpy as np

    return gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)


OBS_SPACE, ACT_SPACE = _spaces()


def small_cfg(tmp_path, **kw):
    """A Config small enough that a learner trains in milliseconds per step."""
    from sacbot.config import Config

    base = dict(hidden=8, batch_size=2, seq_len=4, learning_starts=4, calib_updates=2,
                run_dir=str(tmp_path / "run"), weights_path=str(tmp_path / "w"), quiet=True)
    base.update(kw)
    return Config(**base)


def play(agent, n, opponent="x"):
    """``n`` ticks of a deterministic toy game, episodes of 10 ticks (truncated)."""
    import numpy as np

    agent.new_episode(opponent)
    obs = np.zeros(3, np.float32)
    for t in range(n):
        a = agent.act(obs)
        assert ACT_SPACE.contains(a.astype(np.float32))
        obs = np.full(3, (t % 7) / 7, np.float32)
        agent.observe(float(a[0]), obs, False, t % 10 == 9)
        if t % 10 == 9:
            agent.new_episode(opponent)


# --- waiting on other processes -------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def read_status(run_dir) -> dict:
    import json

    with open(os.path.join(run_dir, "status.json")) as fh:
        return json.load(fh)


def wait_exit(pid: int, timeout: float, what: str) -> None:
    """Block until process ``pid`` (not necessarily our child) has exited: a pidfd becomes
    readable exactly then (Linux >= 5.3)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    finally:
        os.close(fd)


def wait_until(predicate, timeout: float, what: str):
    """Check ``predicate`` until it returns something true, and return that; fail after
    ``timeout`` s.  For state another process keeps in files (status.json, a checkpoint), which
    nothing in the standard library can notify us of: the child's own writes are what we wait for,
    and the interval only sets how soon we look again (a process's exit: ``wait_exit``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = predicate()
            if got:
                return got
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a file being replaced, or not written yet
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)  # the poll interval of a bounded wait on the predicate, not a wait standing in for it


def build_zip(payload: dict, config: dict | None = None, spaces: dict | None = None) -> tuple[bytes, dict]:
    """A checkpoint file's bytes and its manifest, built in memory (write_checkpoint streams the
    same bytes to disk): for tests that compare manifests or corrupt a file's bytes."""
    import io

    from sacbot.store.write import _encode, _write_zip

    entries, manifest = _encode(payload, config, spaces, None)
    buf = io.BytesIO()
    _write_zip(buf, entries, manifest)
    return buf.getvalue(), manifest


def robocode_missing() -> str | None:
    """Why Robocode's tests cannot run here (what is missing and the setup step), or None."""
    from sacbot.robocode.install import RobocodeMissing, find_install

    try:
        find_install()
    except RobocodeMissing as e:
        return str(e)
    return None
