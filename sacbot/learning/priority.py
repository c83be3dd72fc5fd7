"""The learner's priority: it lowers itself so that the acting thread wins the CPU.

    nice = yield_cpu_to_acting(cfg.learner_nice, cfg.learner_idle)   # first thing the learner's thread does

Measured in BENCHMARKS.md ("Who gets the CPU"); the rule is in docs/design.md.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("sacbot")


def yield_cpu_to_acting(nice: int, idle: bool = False) -> int | None:
    """Lower the calling thread's priority by ``nice`` (and with ``idle``, put it under Linux's
    SCHED_IDLE policy), before it starts any thread of its own
    (those inherit it: the I/O thread, torch's pool).  Returns the niceness now in force, or None
    where it cannot be read.

    Why: with the learner and the acting thread both runnable and fewer free cores than that, the
    kernel let the learner run out its time slice while acting waited, a whole scheduler tick
    (~4 ms) at a time; measured by the acting thread's own run-queue delay, not a GIL wait
    (``tools/bench/gil.py``).  At a lower priority the acting thread preempts it on wake-up.
    Linux keeps niceness per thread, so this touches neither the acting thread nor, in a child
    process, anything but the learner; other systems keep it per process, where only a process
    learner (which owns its process) may lower it."""
    if not hasattr(os, "setpriority"):
        _not_applied(nice, idle, "this platform has no os.setpriority")
        return None
    per_thread = sys.platform.startswith("linux")
    if not per_thread and threading.current_thread() is not threading.main_thread():
        # A thread learner would lower the bot's whole process, acting included.
        _not_applied(nice, idle, "only a process learner can have its own priority here (--learner process)")
        return None
    who = threading.get_native_id() if per_thread else 0
    try:
        now = os.getpriority(os.PRIO_PROCESS, who)
        if nice > 0:
            os.setpriority(os.PRIO_PROCESS, who, min(now + nice, 19))
        got = os.getpriority(os.PRIO_PROCESS, who)
    except OSError as e:  # a sandbox that forbids it: the learner still runs, at the bot's priority
        log.warning("could not lower the learner's priority by %d (%s); acting may wait for it", nice, e)
        return None
    if idle and not (per_thread and hasattr(os, "SCHED_IDLE")):
        log.warning("learner_idle: SCHED_IDLE is Linux's; the learner runs at niceness %d", got)
    elif idle:
        try:
            os.sched_setscheduler(who, os.SCHED_IDLE, os.sched_param(0))
        except OSError as e:
            log.warning("could not put the learner under SCHED_IDLE (%s); it runs at niceness %d", e, got)
    return got


def _not_applied(nice: int, idle: bool, why: str) -> None:
    """The settings promise a warning, never silence, where they cannot take effect."""
    asked = [f"learner_nice {nice}"] if nice > 0 else []
    asked += ["learner_idle"] if idle else []
    if asked:
        log.warning("%s not applied: %s; the learner runs at the bot's priority", " and ".join(asked), why)
