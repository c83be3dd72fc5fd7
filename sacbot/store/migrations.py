"""Older checkpoint layouts, read into the current in-memory form.

Format version 1 (sacbot before the entry split) was a zip with ``manifest.json``
(no ``format_version`` key) and a single ``state.msgpack`` entry holding
``{"arrays": {...}, "meta": {...}}`` uncompressed, with the manifest's ``sha256`` and
``size`` describing that one entry.  It stored the SAC temperature as ``alpha``; version 2
stores ``log_alpha`` (the parameter that is optimised).  ``tests/fixtures/ckpt_v1.zip`` is such a file.
"""

from __future__ import annotations

import hashlib

import numpy as np

from sacbot.store import format as ck
from sacbot.store.errors import CheckpointError
from sacbot.wire.messages import unpack


def read_v1(path: str, zf, manifest: dict, by_name: dict, cap: ck.ByteCap) -> dict:
    """The version-1 file as a current checkpoint; ``cap`` bounds its one entry, which is read
    only after its declared size is checked (see checkpoint.py, "Bounded reads")."""
    if "state.msgpack" not in by_name:
        raise CheckpointError(f"{path}: version-1 checkpoint without state.msgpack")
    size = manifest.get("size", -1)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CheckpointError(f"{path}: version-1 manifest declares a bad size {size!r}")
    if size > cap.bytes:
        raise CheckpointError(f"{path}: version-1 state declares {size:,d} bytes, over the byte cap "
                                 f"{cap.bytes:,d} ({cap.why})")
    blob = ck._read_entry(zf, by_name["state.msgpack"], size)
    if len(blob) != size or hashlib.sha256(blob).hexdigest() != manifest.get("sha256"):
        raise CheckpointError(f"{path}: state.msgpack fails its sha256/size check (corrupt)")
    obj = unpack(blob, max_size=size + 1)
    if not isinstance(obj, dict) or not isinstance(obj.get("arrays"), dict):
        raise CheckpointError(f"{path}: version-1 state has no array table")
    arrays, meta = obj["arrays"], obj.get("meta", {})
    for k, v in arrays.items():
        if not isinstance(v, np.ndarray):
            raise CheckpointError(f"{path}: version-1 state: {k} is not an array")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: version-1 state: meta is not a table")
    ck._check_finite(arrays, path)
    if "alpha" in arrays:  # v1 -> v2: the temperature is kept as its log
        alpha = arrays.pop("alpha")
        if not (alpha > 0).all():
            raise CheckpointError(f"{path}: version-1 alpha must be positive, got {alpha}")
        arrays["log_alpha"] = np.log(alpha).astype(np.float32)
    # v1 kept counters at the top level of the manifest; v2 keeps them in meta too.
    migrated = {
        "format": ck.FORMAT, "format_version": ck.FORMAT_VERSION, "migrated_from": 1,
        "step": int(manifest.get("step", meta.get("grad_steps", 0))),
        "env_steps": int(meta.get("env_steps", 0)),
        "config": manifest.get("config", {}), "spaces": manifest.get("spaces", {}),
        "entries": {}, "sacbot_version": manifest.get("sacbot_version", "unknown"),
    }
    return {"manifest": migrated, "arrays": arrays, "meta": meta}
