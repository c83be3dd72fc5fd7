"""What the benchmarks share: CPU-bound load beside a measurement."""

from __future__ import annotations

import contextlib
import multiprocessing
import os


def _spin(parent: int) -> None:
    while os.getppid() == parent:  # ends with the bench, even one that was killed
        pass


@contextlib.contextmanager
def cpu_load(n: int):
    """``n`` CPU-bound processes, at the bench's own priority, for the duration of the block."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.join(5)
