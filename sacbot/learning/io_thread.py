"""The I/O thread: writes each offered checkpoint atomically, off the training thread, so a slow
disk never stalls training.

Usage (inside a learner, which owns both ends)::

    slot = SaveSlot()                               # capacity 1: periodic offers drop while busy
    io = IOThread(slot, weights_dir, keep_last, config, spaces)
    io.start()
    slot.offer(payload)                             # periodic: dropped and counted if busy
    for r in io.results():                          # what the writer did, as plain dicts
        ...
    slot.put_final(payload | {"final": True})       # the final save: waits for room, never dropped
    io.stop(timeout)                                # finishes the save in progress, then exits

The writer reports back through a queue of plain dicts, never through shared attributes:
``{"saved": {...}, "held": {chunk: generation}}`` after a save (``held`` tells the training side
which replay chunks need not be sent again) and ``{"error": "...", "final": bool}`` after a
failure.  A failed save (full disk, permissions) is reported, never kills the learner, and the
next save tries again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from sacbot.store.format import LATEST
from sacbot.store.weights_dir import append_receipt
from sacbot.store.write import ReplayChunkCache, write_checkpoint
from sacbot.wire.channels import SaveSlot

log = logging.getLogger("sacbot")
_SENTINEL = object()


class IOThread(threading.Thread):
    def __init__(self, save_slot: SaveSlot, weights_dir: str, keep_last: int, config: dict, spaces: dict,
                 latest_name: str = LATEST):
        super().__init__(name="sacbot-io", daemon=True)
        self.save_slot, self.weights_dir, self.keep_last = save_slot, weights_dir, keep_last
        self.config, self.spaces, self.latest_name = config, spaces, latest_name
        self.stop_event = threading.Event()
        self.replay_cache = ReplayChunkCache()
        self._results: queue.SimpleQueue = queue.SimpleQueue()

    def results(self) -> list[dict]:
        """What the writer has done since the last call (never blocks)."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def run(self) -> None:
        while True:
            item = self.save_slot.get(timeout=0.2)
            if item is None:
                if self.stop_event.is_set():
                    return
                continue
            try:
                if item is _SENTINEL:
                    return
                self._save(item)
            finally:
                self.save_slot.task_done()

    def _save(self, item: dict) -> None:
        final = bool(item.get("final"))
        try:
            r = write_checkpoint(self.weights_dir, item, self.keep_last, self.config, self.spaces,
                                 cache=self.replay_cache, latest_name=self.latest_name)
        except Exception as e:  # noqa: BLE001 - disk full, permissions: report, go on
            err = f"{type(e).__name__}: {e}"
            log.error("checkpoint save failed (%s); %s", err,
                      "this was the final save" if final else "the next save will try again")
            append_receipt(self.weights_dir, {"time": time.time(), "error": err,
                                              "step": int(item["meta"].get("grad_steps", 0))}, self.latest_name)
            self._results.put({"error": err, "final": final})
            return
        saved = {"path": r.path, "step": r.step, "bytes": r.bytes, "time": time.time()}
        append_receipt(self.weights_dir, {"time": saved["time"], "path": r.path, "step": r.step,
                                          "bytes": r.bytes, "sha256": r.sha256, "write_ms": round(r.write_ms, 2)},
                       self.latest_name)
        self._results.put({"saved": saved, "final": final, "held": self.replay_cache.held()})

    def stop(self, timeout: float) -> bool:
        """Finish the save in progress, then exit.  Returns True if the thread ended."""
        try:
            self.save_slot.put_final(_SENTINEL, timeout=timeout)
        except queue.Full:  # slot still full after the timeout: fall back to the event
            self.stop_event.set()
        self.join(timeout)
        return not self.is_alive()
