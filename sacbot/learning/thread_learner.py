"""The thread learner: the learner boundary (:mod:`sacbot.wire.boundary`) on a thread of the bot's process.

    learner = ThreadLearner(spec, checkpoint, queue_size=256)   # spec, checkpoint: plain data
    learner.send([NewEpisode("tracker"), transition])           # the boundary, as in learner.py
    final = learner.close(acting_rng)

The thread builds its own torch objects inside ``run()`` from the plain spec and checkpoint
payload; messages go in through the link's bounded queue, the actor comes back through the
link's snapshot and status through ``push_status``.  Nothing torch crosses the thread boundary.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from sacbot.learning.training import LearnerLoop, LearnerSpec
from sacbot.wire.boundary import LearnerLink, not_confirmed
from sacbot.wire.messages import Shutdown
from sacbot.wire.status import LearnerStatus

log = logging.getLogger("sacbot")


def _no_torch_teardown_in_child() -> None:
    """A child forked from a bot whose training thread runs must not deregister torch's operator
    libraries at its exit (torch does it in weakref finalizers, which run at exit).  The training thread
    may have been reading the dispatcher's operator table at the fork; the child inherits that reader's
    count with no thread left to drop it, and the deregistration's write waits for it forever (seen: a
    child's ``sys.exit`` spinning in ``c10::Dispatcher::cleanup``, once in 80 forks beside a busy core).
    The operating system frees all of it at exit anyway.  Private names of CPython's weakref and of
    torch: if either moves, nothing is skipped, as before."""
    try:
        import torch.library

        for f in list(weakref.finalize._registry):  # type: ignore[attr-defined]
            info = f.peek()
            if info is not None and info[1] is torch.library._del_library:
                f.atexit = False
    except Exception:  # noqa: BLE001 - a fork must not fail over a teardown it could not skip
        pass


if hasattr(os, "register_at_fork"):  # POSIX; Windows forks nothing
    os.register_at_fork(after_in_child=_no_torch_teardown_in_child)


class ThreadLearner(LearnerLink):
    kind = "thread"

    def __init__(self, spec: LearnerSpec, checkpoint: dict | None, queue_size: int):
        super().__init__(queue_size)
        self._stop = threading.Event()
        self.loop = LearnerLoop(spec, checkpoint, self.outbox, self.publish, self.push_status, self._stop)
        self._thread = threading.Thread(target=self.loop.run, name="sacbot-training", daemon=True)
        self._thread.start()

    def close(self, acting_rng: str | None = None, timeout: float = 60.0) -> LearnerStatus:
        """Shutdown, the final save, the thread joined: all within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        # Shutdown goes through the same queue as the data (a reserved place), so the learner
        # takes everything sent before it, in order (STYLE 15).
        if not self.outbox.send(Shutdown(acting_rng or ""), control_wait=max(0.0, timeout / 2)):
            self._stop.set()  # the queue never freed a place: stop by the event instead
        self.loop.closing.set()  # a pass in progress ends at its next step; the rest stays owed
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.error("the training thread did not finish the final save within the %g s deadline; "
                      "final save not confirmed", timeout)
            self._stop.set()
            return self.status().but(learner_alive=True,
                                     final_save=not_confirmed(timeout, "the training thread did not finish in time"))
        return self.status()

    def abort(self, timeout: float) -> bool:
        """End without a final save (the bot failed to start); True once the thread is gone."""
        self.loop.discard = True
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the training thread did not stop within %g s of a failed start", timeout)
            return False
        return True
