"""The weight snapshot: training publishes the deployable actor, acting pulls it.

Usage::

    snap = WeightSnapshot()
    snap.publish(learner.export_actor())      # training thread, after each pass
    reader = SnapshotReader(snap)
    if reader.pull():                         # acting thread, each tick: cheap when unchanged
        params = policy.build_params(reader.arrays)   # rebuilt outside the lock

The arrays are allocated once and written in place under the lock, so the lock is
held only for a memcpy (SPEC section 4).  The one exception is a change of layout:
when calibration ends, fp32 weights become int8 + scales, and the set of arrays is
reallocated once.
"""

from __future__ import annotations

import threading
import time

import numpy as np


class WeightSnapshot:
    def __init__(self):
        self._lock = threading.Lock()
        self._arrays: dict[str, np.ndarray] = {}
        self._version = 0
        self.last_publish_hold_s = 0.0
        self.last_pull_hold_s = 0.0

    @property
    def version(self) -> int:
        return self._version  # an int read is atomic; a stale read only delays a pull

    def publish(self, arrays: dict[str, np.ndarray]) -> int:
        with self._lock:
            t0 = time.perf_counter()
            same = arrays.keys() == self._arrays.keys() and all(
                self._arrays[k].shape == a.shape and self._arrays[k].dtype == a.dtype
                for k, a in arrays.items())
            if same:
                for k, a in arrays.items():
                    np.copyto(self._arrays[k], a)
            else:
                self._arrays = {k: np.array(a, copy=True) for k, a in arrays.items()}
            self._version += 1
            self.last_publish_hold_s = time.perf_counter() - t0
            return self._version

    def pull_into(self, dst: dict[str, np.ndarray], have_version: int) -> int | None:
        """Copy the arrays into ``dst`` (reusing its buffers) if the published version
        is newer than ``have_version``.  Returns the new version, or None if unchanged."""
        if self._version == have_version:
            return None
        with self._lock:
            t0 = time.perf_counter()
            for k, a in self._arrays.items():
                d = dst.get(k)
                if d is not None and d.shape == a.shape and d.dtype == a.dtype:
                    np.copyto(d, a)
                else:
                    dst[k] = a.copy()
            for k in list(dst):
                if k not in self._arrays:
                    del dst[k]
            version = self._version
            self.last_pull_hold_s = time.perf_counter() - t0
        return version


class SnapshotReader:
    """The acting side's copy: ``pull()`` returns False when the version is unchanged."""

    def __init__(self, snapshot: WeightSnapshot):
        self.snapshot = snapshot
        self.version = 0
        self.arrays: dict[str, np.ndarray] = {}

    def pull(self) -> bool:
        v = self.snapshot.pull_into(self.arrays, self.version)
        if v is None:
            return False
        self.version = v
        return True
