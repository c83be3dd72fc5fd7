"""What the benchmarks share: CPU-bound load beside a measurement, and a ``sacbot serve`` to measure."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading


def scratch_dir(prefix: str) -> str:
    """A temporary folder removed when the benchmark exits: its runs write checkpoints (hundreds of MB
    for some), and a benchmark run again and again must not fill the disk."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _spin(parent: int, nice: int) -> None:
    os.nice(nice)
    while os.getppid() == parent:  # ends with the bench, even one that was killed
        pass


@contextlib.contextmanager
def cpu_load(n: int, nice: int = 0):
    """``n`` CPU-bound processes for the duration of the block, at the bench's own priority plus
    ``nice`` (0 to 19: a process may only lower its own)."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice = {nice}: expected 0 to 19 (a process may lower its own priority only)")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(os.getpid(), nice), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.join(5)


class ServeProcess:
    """``sacbot serve --root ROOT --port 0 [--socket SOCK] FLAGS`` as a child process for the length of
    a ``with``: ``port`` is the TCP port it bound (from its own "listening" line); its stderr is read
    and dropped after that (a full pipe would block it); leaving the block sends SIGTERM (every bot's
    final save) and kills it if it has not exited within ``stop_timeout`` s.  ``proc.returncode``
    then says how it ended."""

    def __init__(self, root: str, flags: list[str], socket: str | None = None, stop_timeout: float = 120.0):
        self.socket, self.stop_timeout = socket, stop_timeout
        self.proc = subprocess.Popen([sys.executable, "-m", "sacbot", "serve", "--root", root, "--port", "0",
                                      *(["--socket", socket] if socket else []), *flags],
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        self.port: int | None = None
        said = []  # what it printed before it listened: the reason, if it never does
        for line in self.proc.stderr:
            if "listening on tcp 127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0].rstrip(","))
                break
            said.append(line)
        if self.port is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
            raise SystemExit(f"sacbot serve did not start (exit {self.proc.returncode}): "
                             + ("".join(said[-5:]).strip() or "it printed nothing"))
        threading.Thread(target=self.proc.stderr.read, name="serve-stderr", daemon=True).start()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=60)
