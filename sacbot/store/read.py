"""Reading a checkpoint: every byte checked against its cap and digest before it is used.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
import zipfile

import numpy as np
import zstandard

from sacbot.store.errors import CheckpointError, CheckpointTooNew, CheckpointUnreadable
from sacbot.store.format import (
    CHUNK_RE,
    ENTRIES,
    FORMAT,
    FORMAT_VERSION,
    MAX_CHECKPOINT_BYTES,
    MAX_ENTRIES,
    MAX_MANIFEST_BYTES,
    READABLE_VERSIONS,
    ByteCap,
    _check_finite,
    _entry_name,
    _int_at_least,
    _read_entry,
    _sacbot_version,
    byte_cap_for,
)
from sacbot.store.state import check_training_state
from sacbot.wire.messages import MessageError, unpack

# --- loading -------------------------------------------------------------------------
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")




def _read_manifest(zf: zipfile.ZipFile, path: str) -> dict:
    info = zf.getinfo("manifest.json")
    try:
        manifest = json.loads(_read_entry(zf, info, MAX_MANIFEST_BYTES))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: manifest.json is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format", FORMAT) != FORMAT:
        fmt = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{path}: not a sacbot checkpoint (format {fmt!r})")
    # Before any other check: a newer format may lay its manifest out otherwise, and it is not damage.
    version = manifest.get("format_version", 1)  # format 1 wrote no version
    if not _int_at_least(version, 1):
        raise CheckpointError(f"{path}: manifest format_version = {version!r}, expected an integer >= 1 (corrupt)")
    if version > FORMAT_VERSION:
        raise CheckpointTooNew(
            f"{path}: written by a newer sacbot ({manifest.get('sacbot_version', 'unknown')!s:.40}, checkpoint format "
            f"version {version}); this sacbot {_sacbot_version()} reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Upgrade sacbot (pip install -U sacbot) to go on with this bot, "
            "or pass another --weights-path for a new one")
    # The manifest is not under a hash of its own (it holds the entries' hashes), so what readers
    # take from it directly is checked here: a resume, `sacbot inspect` and the tools use these.
    for key in ("config", "spaces"):
        if not isinstance(manifest.get(key, {}), dict):
            raise CheckpointError(f"{path}: manifest {key} = {manifest[key]!r}, expected an object (corrupt)")
    spaces = manifest.get("spaces", {})
    for key, v, least in (("step", manifest.get("step", 0), 0), ("env_steps", manifest.get("env_steps", 0), 0),
                          ("spaces.obs_dim", spaces.get("obs_dim", 1), 1),
                          ("spaces.act_dim", spaces.get("act_dim", 1), 1)):
        if not _int_at_least(v, least):
            raise CheckpointError(f"{path}: manifest {key} = {v!r}, expected an integer >= {least} (corrupt)")
    return manifest


def read_checkpoint(path: str, entries: tuple[str, ...] | None = None, cap: int | None = None) -> dict:
    """Verify and decode a checkpoint.  Returns {"manifest", "arrays", "meta", "byte_cap"}.
    Raises CheckpointError, and only CheckpointError, for anything wrong with the file.

    ``cap`` bounds the decompressed bytes of the whole file (``checkpoint_byte_cap`` gives the
    cap for a config).  Without it the cap is derived from the sizes the manifest states; either
    way never over ``MAX_CHECKPOINT_BYTES``.  A run that resumes should not pass a cap from its
    own config: a file from a bigger ``--buffer-size`` is a changed setting, not a corrupt file."""
    try:
        ckpt = _read_checkpoint(path, entries, cap)
        if entries is None or "training" in entries:
            check_training_state(ckpt, path, replay_read=entries is None or "replay" in entries)
        return ckpt
    except CheckpointError:
        raise
    except MemoryError:
        raise CheckpointUnreadable(f"{path}: out of memory while reading it; {_what_to_do(errno.ENOMEM)}") from None
    except OSError as e:
        if e.errno not in _BAD_BYTES_ERRNOS:  # the system's reason, not the bytes'
            why = os.strerror(e.errno) if e.errno else str(e)
            raise CheckpointUnreadable(f"{path}: cannot be read ({why}); {_what_to_do(e.errno)}") from None
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None
    except zstandard.ZstdError as e:
        if "memory" in str(e).lower():  # zstd could not allocate its buffers
            raise CheckpointUnreadable(f"{path}: out of memory while reading it ({e}); "
                                       f"{_what_to_do(errno.ENOMEM)}") from None
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, KeyError, TypeError, IndexError,
            OverflowError, MessageError, NotImplementedError, RuntimeError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None


def _size(d, key: str, path: str, name: str) -> int:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CheckpointError(f"{path}: manifest entry {name} has no valid {key} ({v!r})")
    return v


def _check_declared(path: str, by_name: dict[str, zipfile.ZipInfo], declared: dict, cap: ByteCap) -> None:
    """Every size the file declares, against the cap, before any entry is read."""
    over = f"over the byte cap {cap.bytes:,d} ({cap.why})"
    for n, info in by_name.items():
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{path}: entry {n} is compressed inside the zip (method {info.compress_type}, "
                                  f"declaring {info.file_size:,d} bytes); sacbot stores entries uncompressed, "
                                  "so it did not write this file")
    stored = sum(i.file_size for i in by_name.values())
    if stored > cap.bytes:
        raise CheckpointError(f"{path}: its zip members declare {stored:,d} bytes, {over}")
    raw = 0
    for n, d in declared.items():
        size, raw_size = _size(d, "size", path, n), _size(d, "raw_size", path, n)
        if n in by_name and by_name[n].file_size != size:
            raise CheckpointError(f"{path}: entry {n} is {by_name[n].file_size:,d} bytes in the zip, "
                                  f"{size:,d} in the manifest (corrupt)")
        raw += raw_size
    if raw > cap.bytes:
        raise CheckpointError(f"{path}: its entries declare {raw:,d} decompressed bytes, {over}")


def _check_regular(path: str) -> None:
    # Opening a FIFO blocks until a writer comes, and a signal does not interrupt it (Python retries
    # the open): a run or eval would hang on one, killable only by SIGKILL.  Not bad bytes either: a
    # directory or FIFO someone put there is left where it is, and loading stops.
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
        raise CheckpointUnreadable(f"{path}: is {kind}, not a regular file (a checkpoint is a zip file); move it "
                                   "out of the way (or rename it) and start again")


# Why the system would not give us a file's bytes, and what to do about it.  Any other errno is
# reported with the generic advice; EINVAL alone is taken as bad bytes (a seek to a negative offset
# that a torn zip declares).
_ERRNO_ADVICE = {
    errno.EACCES: "give this user read access to it (and to its folder), or run as its owner",
    errno.EPERM: "give this user read access to it (and to its folder), or run as its owner",
    errno.ENOENT: "it was moved or deleted while it was being read; start again",
    errno.EIO: "the disk reported an I/O error; check the disk (dmesg) and copy the file elsewhere",
    errno.EMFILE: "this process has too many open files; raise the limit (ulimit -n) and start again",
    errno.ENFILE: "the system has too many open files; close some programs and start again",
    errno.ENOMEM: "the system is out of memory; free some and start again",
    errno.ENOBUFS: "the system is out of memory; free some and start again",
}
_BAD_BYTES_ERRNOS = {errno.EINVAL}


def _what_to_do(code: int | None) -> str:
    return _ERRNO_ADVICE.get(code, "fix the cause and start again")  # type: ignore[arg-type]


def _read_checkpoint(path: str, entries: tuple[str, ...] | None, cap_arg: int | None) -> dict:
    _check_regular(path)
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if "manifest.json" not in {i.filename for i in infos}:
            raise CheckpointError(f"{path}: no manifest.json")
        manifest = _read_manifest(zf, path)  # first: a newer format stops here, whatever else it holds
        if len(infos) > MAX_ENTRIES:
            raise CheckpointError(f"{path}: {len(infos)} zip entries, at most {MAX_ENTRIES} expected")
        by_name = {}
        for info in infos:
            n = info.filename
            if not _SAFE_NAME.match(n) or n.startswith(".") or ".." in n:
                raise CheckpointError(f"{path}: unsafe entry name {n!r}")
            by_name[n] = info
        cap = byte_cap_for(manifest, cap_arg)
        version = manifest.get("format_version", 1)  # _read_manifest checked it: an int in 1..FORMAT_VERSION
        if version == 1:
            from sacbot.store.migrations import read_v1
            return {**read_v1(path, zf, manifest, by_name, cap), "byte_cap": cap}
        if version not in READABLE_VERSIONS:
            raise CheckpointError(f"{path}: format_version {version!r} is not supported "
                                  f"(this sacbot reads {', '.join(map(str, READABLE_VERSIONS))})")
        declared = manifest.get("entries")
        if not isinstance(declared, dict):
            raise CheckpointError(f"{path}: manifest has no entry table")
        _check_declared(path, by_name, declared, cap)
        for n in by_name:
            if n != "manifest.json" and n not in declared:
                logging.getLogger("sacbot").warning("%s: ignoring unknown entry %r", path, n)
        kinds = entries or ENTRIES
        want = [_entry_name(k) for k in kinds if k != "replay"]
        chunks = sorted(n for n in declared if CHUNK_RE.match(n))
        if "replay" in kinds:  # optional: v3 chunks, or v2's single entry
            if chunks != [f"replay-{k:03d}.msgpack.zst" for k in range(len(chunks))]:
                raise CheckpointError(f"{path}: replay chunks {chunks} are not numbered 000, 001, ...")
            want += chunks or [n for n in (_entry_name("replay"),) if n in declared]
        arrays: dict[str, np.ndarray] = {}
        parts: dict[str, list[np.ndarray]] = {}
        meta: dict = {}
        budget = cap.bytes  # enforced while streaming too, not only from the declarations
        for n in want:
            if n not in declared:
                raise CheckpointError(f"{path}: entry {n} is missing from the manifest")
            if n not in by_name:
                raise CheckpointError(f"{path}: entry {n} is listed but absent")
            d = declared[n]
            size, raw_size = d["size"], d["raw_size"]
            blob = _read_entry(zf, by_name[n], size)
            if len(blob) != size or hashlib.sha256(blob).hexdigest() != d["sha256"]:
                raise CheckpointError(f"{path}: entry {n} fails its sha256/size check (corrupt)")
            obj = decode_entry(blob, raw_size, path, n, budget)
            budget -= raw_size
            if CHUNK_RE.match(n):
                for k, v in obj["arrays"].items():
                    parts.setdefault(k, []).append(v)
            else:
                arrays.update(obj["arrays"])
            if "meta" in obj:
                meta = obj["meta"]
        for k, vs in parts.items():
            if len(vs) != len(chunks) or len({v.shape[1:] for v in vs}) != 1:
                raise CheckpointError(f"{path}: replay chunks disagree on {k}")
            arrays[k] = np.concatenate(vs)
        _check_finite(arrays, path)
        return {"manifest": manifest, "arrays": arrays, "meta": meta, "byte_cap": cap}


def decode_entry(blob: bytes, raw_size: int, path: str, name: str, limit: int = MAX_CHECKPOINT_BYTES) -> dict:
    """Decompress and decode one entry, never producing more than ``raw_size`` (checked against
    ``limit`` and against the zstd frame's own content size first) bytes."""
    if raw_size < 0 or raw_size > limit:
        raise CheckpointError(f"{path}: entry {name} declares {raw_size:,d} decompressed bytes, over the "
                              f"{limit:,d} left under the byte cap")
    fcs = zstandard.frame_content_size(blob)
    if fcs != raw_size:
        raise CheckpointError(f"{path}: entry {name} content size {fcs} differs from manifest {raw_size}")
    raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=raw_size)
    if len(raw) != raw_size:
        raise CheckpointError(f"{path}: entry {name} decompressed to {len(raw):,d} bytes, not {raw_size:,d}")
    obj = unpack(raw, max_size=raw_size + 1)
    if not isinstance(obj, dict) or not isinstance(obj.get("arrays"), dict):
        raise CheckpointError(f"{path}: entry {name} has no array table")
    for k, v in obj["arrays"].items():
        if not isinstance(v, np.ndarray):
            raise CheckpointError(f"{path}: {name}: {k} is not an array")
    return obj


