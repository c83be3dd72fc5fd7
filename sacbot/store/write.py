"""Writing a checkpoint: encode the entries, check them, write the zip atomically.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from typing import BinaryIO

import numpy as np
import zstandard

from sacbot.store.atomic import atomic_write
from sacbot.store.errors import CheckpointError, NonFiniteState
from sacbot.store.format import (
    ENTRIES,
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    Receipt,
    _encode_entry,
    _entry_name,
    _sacbot_version,
    byte_cap_for,
    split_payload,
)
from sacbot.store.state import _shown, training_state_problem
from sacbot.store.weights_dir import check_latest_name, rotate, step_name


class ReplayChunkCache:
    """Encoded replay chunks by index, with the generation each was encoded at.  The I/O thread
    keeps one, so a save re-encodes only the chunks the payload brings (those written since)."""

    def __init__(self):
        self._chunks: dict[int, tuple[int, bytes, str]] = {}  # index -> (gen, blob, sha256)

    def held(self) -> dict[int, int]:
        return {k: g for k, (g, _, _) in self._chunks.items()}

    def entries(self, chunks: list[dict], gens: list[int]) -> dict[str, tuple[bytes, str]]:
        for c in chunks:
            blob = _encode_entry({"arrays": c["arrays"]})
            self._chunks[int(c["index"])] = (int(c["gen"]), blob, hashlib.sha256(blob).hexdigest())
        for k in [k for k in self._chunks if k >= len(gens)]:
            del self._chunks[k]  # the buffer was cleared and holds fewer chunks now
        out = {}
        for k, g in enumerate(gens):
            held = self._chunks.get(k)
            if held is None or held[0] != g:
                self._chunks.pop(k, None)  # make the training thread send it again
                raise CheckpointError(f"replay chunk {k} (generation {g}) is neither in the payload nor "
                                      "held by the writer; the next save carries it")
            out[f"replay-{k:03d}.msgpack.zst"] = held[1:]
        return out


def _encode(payload: dict, config: dict | None, spaces: dict | None,
            cache: ReplayChunkCache | None) -> tuple[dict[str, tuple[bytes, str]], dict]:
    meta = payload["meta"]
    parts = split_payload(payload["arrays"])
    entries: dict[str, tuple[bytes, str]] = {}
    for kind in ENTRIES:
        if kind == "replay":
            continue
        obj: dict = {"arrays": parts[kind]}
        if kind == "training":
            obj["meta"] = meta
        blob = _encode_entry(obj)
        entries[_entry_name(kind)] = (blob, hashlib.sha256(blob).hexdigest())
    if "replay_chunks" in payload:
        entries.update((cache or ReplayChunkCache()).entries(payload["replay_chunks"],
                                                             meta["replay"]["chunk_gens"]))
    elif parts["replay"]:  # replay.* arrays given whole: one chunk
        blob = _encode_entry({"arrays": parts["replay"]})
        entries["replay-000.msgpack.zst"] = (blob, hashlib.sha256(blob).hexdigest())
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "sacbot_version": _sacbot_version(),
        "created": time.time(),
        "step": int(meta.get("grad_steps", 0)),
        "env_steps": int(meta.get("env_steps", 0)),
        "config": config or {},
        "spaces": spaces or {},
        "entries": {n: {"sha256": sha, "size": len(b), "raw_size": _content_size(b)}
                    for n, (b, sha) in entries.items()},
    }
    return entries, manifest


def _write_zip(fh: BinaryIO, entries: dict[str, tuple[bytes, str]], manifest: dict) -> None:
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(_zinfo("manifest.json"), json.dumps(manifest, indent=1, sort_keys=True))
        for n, (b, _) in entries.items():
            zf.writestr(_zinfo(n), b)


def _copy_into(src: str, fh: BinaryIO) -> None:
    with open(src, "rb") as s:
        shutil.copyfileobj(s, fh, 1 << 20)


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)  # hashlib and file reads release the GIL on blocks this big
    return h.hexdigest()


def _zinfo(name: str) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # fixed: reproducible bytes
    zi.compress_type = zipfile.ZIP_STORED
    return zi


def _content_size(frame: bytes) -> int:
    return zstandard.frame_content_size(frame)


def _non_finite(payload: dict) -> list[tuple[str, int, int]]:
    """(name, non-finite count, size) of each float array of the payload holding NaN or inf."""
    arrays = list(payload["arrays"].items())
    for c in payload.get("replay_chunks", ()):
        arrays += [(f"{k} (replay chunk {c['index']})", v) for k, v in c["arrays"].items()]
    out = []
    for k, a in arrays:
        a = np.asarray(a)
        if a.dtype.kind in "fc":
            bad = a.size - int(np.count_nonzero(np.isfinite(a)))
            if bad:
                out.append((k, bad, a.size))
    return out


def _check_writable(directory: str, payload: dict, manifest: dict) -> None:
    """Refuse what must never reach disk: non-finite arrays (a poisoned learner), and a file over
    the cap its own readers would derive (they would set it aside as corrupt)."""
    step = manifest["step"]
    bad = _non_finite(payload)
    if bad:
        names = ", ".join(f"{k} ({n} of {size})" for k, n, size in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise NonFiniteState(f"refusing to save step {step}: {len(bad)} array(s) hold NaN or inf: {names}; "
                             f"nothing was written, the checkpoints in {directory!r} are kept")
    total = sum(e["raw_size"] for e in manifest["entries"].values())
    cap = byte_cap_for(manifest)
    if total > cap.bytes:
        raise CheckpointError(f"refusing to save step {step}: it would hold {total:,d} decompressed bytes, "
                              f"over the cap {cap.bytes:,d} ({cap.why}) that a reader applies; nothing was "
                              "written (lower --buffer-size)")


def write_checkpoint(directory: str, payload: dict, keep_last: int = 5, config: dict | None = None,
                     spaces: dict | None = None, cache: ReplayChunkCache | None = None,
                     latest_name: str = LATEST) -> Receipt:
    """Write ``sac_step_<N>.zip`` and ``latest_name`` (``sac_latest.zip``, or the file name the
    original bot's weights path gave) atomically, rotate, return a receipt.
    ``cache`` supplies replay chunks the payload leaves out (see ``ReplayChunkCache``).  Raises
    ``NonFiniteState`` (writing nothing) when an array holds NaN or inf, and ``CheckpointError``
    when the file would be over its byte cap.  The caller should hold the directory's
    ``sacbot.store.lock.WriterLock``."""
    t0 = time.perf_counter()
    check_latest_name(latest_name)
    meta = payload.get("meta")
    problem = training_state_problem(meta, {"spaces": spaces or {}})
    if problem:  # its readers would set the file aside as corrupt
        step = meta.get("grad_steps") if isinstance(meta, dict) else None
        raise CheckpointError(f"refusing to save step {_shown(step)}: its training state is not one a resume can "
                              f"use ({problem}); nothing was written, the checkpoints in {directory!r} are kept")
    os.makedirs(directory, exist_ok=True)
    entries, manifest = _encode(payload, config, spaces, cache)
    _check_writable(directory, payload, manifest)
    step = manifest["step"]
    step_path = os.path.join(directory, step_name(latest_name, step))
    latest_path = os.path.join(directory, latest_name)
    # The newest first, then its step copy: a crash in between leaves the newest ahead of the step
    # files, never behind them, so a step file newer than the newest is always a person's doing (a
    # rollback) and a start can refuse it instead of silently undoing it.  Streamed to disk rather
    # than assembled in memory: on the I/O thread, big in-memory copies hold the GIL and stall the
    # training thread; file writes and reads release it.
    atomic_write(latest_path, lambda fh: _write_zip(fh, entries, manifest))
    size, sha = os.path.getsize(latest_path), _file_sha256(latest_path)
    atomic_write(step_path, lambda fh: _copy_into(latest_path, fh))
    # The file just written comes from finite arrays with fresh digests: rotation need not re-read it.
    rotate(directory, keep_last, verified=(step_path,), latest_name=latest_name)
    return Receipt(path=step_path, step=step, bytes=size, sha256=sha,
                   write_ms=(time.perf_counter() - t0) * 1e3,
                   entry_bytes={n: e["size"] for n, e in manifest["entries"].items()})
