"""A short CPU time slice for the acting thread, so that it runs as soon as it wakes.

    applied = request_time_slice(100)   # the calling thread; True where the kernel took it

Why: a thread that wakes (a game tick, the GIL handed back) on a core where another thread is
running waits until that thread's slice ends or it is preempted.  Linux's scheduler (EEVDF, from
6.6) protects the running thread's slice, 0.7-3 ms by default, and from 6.12 lets a waking thread
that asked for a shorter slice cut that protection short (``sched_setattr`` with
``sched_runtime`` under ``SCHED_OTHER``; 100 µs to 100 ms).  An acting thread runs for tens of
microseconds a tick, so a short slice costs it nothing and takes the scheduler's tick (~4 ms)
out of act()'s slowest calls (BENCHMARKS.md, "Who gets the CPU").

Unprivileged, per thread, and only the calling thread's.  Elsewhere (another system, an older
kernel, a thread under another policy) nothing changes and the call says False.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys

log = logging.getLogger("sacbot")

MIN_US, MAX_US = 100, 100_000  # the kernel's bounds on a custom slice
# sched_setattr / sched_getattr: x86_64's numbers, and the generic table's (arm64, riscv64, loongarch64).
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "arm64": (274, 275), "riscv64": (274, 275),
             "loongarch64": (274, 275)}


class _SchedAttr(ctypes.Structure):  # struct sched_attr, its first version (48 bytes)
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64)]


def supported() -> str | None:
    """None where a custom slice can be asked for; otherwise why not."""
    if not sys.platform.startswith("linux"):
        return f"{sys.platform} has no per-thread time slice to ask for"
    if platform.machine() not in _SYSCALLS:
        return f"sched_setattr's number on {platform.machine()} is not known here"
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return f"kernel release {platform.release()!r} not understood"
    if (major, minor) < (6, 12):
        return f"Linux {major}.{minor} ignores a custom slice (6.12 and later honour it)"
    return None


def request_time_slice(us: int) -> bool:
    """Ask for a time slice of ``us`` microseconds (100 to 100,000) for the calling thread, keeping
    its niceness.  Returns True where the kernel now holds it for the thread, False where it cannot
    apply (logged at debug: an unsupported system is not the user's error)."""
    if not MIN_US <= us <= MAX_US:
        raise ValueError(f"time slice {us} us is not accepted: expected {MIN_US} to {MAX_US}")
    why = supported()
    if why is None and os.sched_getscheduler(0) != os.SCHED_OTHER:
        why = "the thread runs under another scheduling policy, which is left as it is"
    if why is None:
        setattr_nr, getattr_nr = _SYSCALLS[platform.machine()]
        libc = ctypes.CDLL(None, use_errno=True)
        attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_policy=os.SCHED_OTHER,
                          sched_nice=os.getpriority(os.PRIO_PROCESS, 0), sched_runtime=us * 1000)
        if libc.syscall(setattr_nr, 0, ctypes.byref(attr), 0) != 0:
            why = f"sched_setattr: {os.strerror(ctypes.get_errno())}"
        else:
            got = _SchedAttr()
            if libc.syscall(getattr_nr, 0, ctypes.byref(got), ctypes.sizeof(got), 0) != 0:
                why = f"sched_getattr: {os.strerror(ctypes.get_errno())}"
            elif got.sched_runtime != us * 1000:
                why = f"the kernel holds a slice of {got.sched_runtime / 1000:g} us, not {us}"
    if why is not None:
        log.debug("acting_slice_us %d not applied: %s", us, why)
        return False
    return True
