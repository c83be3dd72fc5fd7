"""Checkpoint format (SPEC section 12): a zip of zstd-compressed msgpack entries.

Usage::

    receipt = write_checkpoint(weights_dir, payload, keep_last=5)     # I/O thread
    loaded = load_latest(weights_dir, expect={"obs_dim": 3, ...})     # at start
    actor = load_actor(path)                                          # eval / acting-only

``payload`` is plain data: ``{"arrays": {name: ndarray}, "meta": {...}}`` as the
training thread builds it.  Array names are routed to entries by prefix:

=====================  =============================================================
entry                  contents
=====================  =============================================================
manifest.json          format, format_version, sacbot version, time, counters, config,
                       spaces, sha256 and size of every other entry
model.msgpack.zst      actor.*, critic.*, target.*, log_alpha (quantizer scales are
                       actor parameters)
optimizer.msgpack.zst  opt.<optimizer>.<i>.{step, exp_avg, exp_avg_sq}
training.msgpack.zst   rng.* arrays and the JSON-able counters and RNG states
replay-NNN.msgpack.zst  replay.* (optional), rows of chunk NNN (000, 001, ...);
                       concatenated in order on load
actor.msgpack.zst      the deployable actor export alone
=====================  =============================================================

Version 3 split the replay into row chunks so that a periodic save re-encodes only the
chunks written since the previous one (``ReplayChunkCache``, held by the I/O thread);
version 2 had one ``replay.msgpack.zst`` and still loads.

Zip entries are stored uncompressed; each payload is compressed by zstd.  Writes go to
a temp file in the same directory, are fsynced, renamed over the target and the
directory is fsynced, so a crash leaves either the old file or the new one.  Nothing
is ever unpickled: msgpack decodes with ``raw=False`` and ``strict_map_key``, and every
decompression is bounded by the manifest's size and an absolute cap.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import zstandard

from .messages import MessageError, pack, unpack

FORMAT = "sacbot-checkpoint"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
LATEST = "sac_latest.zip"
STEP_RE = re.compile(r"^sac_step_(\d+)\.zip$")
CHUNK_RE = re.compile(r"^replay-(\d{3})\.msgpack\.zst$")
TMP_PREFIX = ".sacbot-tmp-"
MAX_ENTRY_BYTES = 2 << 30  # absolute cap on any decompressed entry (2 GiB)
MAX_MANIFEST_BYTES = 1 << 20
MAX_ENTRIES = 80  # the fixed entries + up to 64 replay chunks
ZSTD_LEVEL = 3  # measured in BENCHMARKS.md: level 3 is ~as small as 9 on weights, far faster

ENTRY_OF_PREFIX = (("actor.", "model"), ("critic.", "model"), ("target.", "model"),
                   ("log_alpha", "model"), ("opt.", "optimizer"), ("rng.", "training"),
                   ("replay.", "replay"), ("export.", "actor"))
ENTRIES = ("model", "optimizer", "training", "replay", "actor")


class CheckpointError(Exception):
    """A checkpoint file cannot be used; the message says why."""


class CheckpointMismatch(CheckpointError):
    """A sound checkpoint of a bot with other settings (env spaces, network size, quantization)
    than this run's.  Not the file's fault: it is never set aside, and loading stops."""


def _sacbot_version() -> str:
    from . import __version__
    return __version__


def _entry_name(kind: str) -> str:
    return f"{kind}.msgpack.zst"


def split_payload(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {k: {} for k in ENTRIES}
    for name, a in arrays.items():
        for prefix, kind in ENTRY_OF_PREFIX:
            if name.startswith(prefix):
                out[kind][name] = a
                break
        else:
            raise ValueError(f"array {name!r} has no checkpoint entry")
    return out


def _encode_entry(obj) -> bytes:
    # Sorted keys + fixed zstd level: the same state gives the same bytes and sha256.
    raw = pack(_sorted(obj))
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(raw)


def _sorted(obj):
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    return obj


@dataclass
class Receipt:
    path: str
    step: int
    bytes: int
    sha256: str
    write_ms: float
    entry_bytes: dict


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support directory fsync
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    """``write(fh)`` into a temp file in the same directory, flush, fsync, os.replace, fsync
    the directory: a crash leaves the old file or the new one, never a mix."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f"{TMP_PREFIX}{os.getpid()}-{os.path.basename(path)}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)


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


def build_zip(payload: dict, config: dict | None = None, spaces: dict | None = None,
              cache: ReplayChunkCache | None = None) -> tuple[bytes, dict]:
    """The checkpoint file's bytes and its manifest (write_checkpoint streams the same bytes)."""
    entries, manifest = _encode(payload, config, spaces, cache)
    buf = io.BytesIO()
    _write_zip(buf, entries, manifest)
    return buf.getvalue(), manifest


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


def write_checkpoint(directory: str, payload: dict, keep_last: int = 5, config: dict | None = None,
                     spaces: dict | None = None, cache: ReplayChunkCache | None = None) -> Receipt:
    """Write ``sac_latest.zip`` and ``sac_step_<N>.zip`` atomically, rotate, return a receipt.
    ``cache`` supplies replay chunks the payload leaves out (see ``ReplayChunkCache``)."""
    t0 = time.perf_counter()
    os.makedirs(directory, exist_ok=True)
    entries, manifest = _encode(payload, config, spaces, cache)
    step = manifest["step"]
    step_path = os.path.join(directory, f"sac_step_{step}.zip")
    # Streamed to disk rather than assembled in memory: on the I/O thread, big in-memory copies
    # hold the GIL and stall the training thread; file writes and reads release it.
    atomic_write(step_path, lambda fh: _write_zip(fh, entries, manifest))
    size, sha = os.path.getsize(step_path), _file_sha256(step_path)
    atomic_write(os.path.join(directory, LATEST), lambda fh: _copy_into(step_path, fh))
    rotate(directory, keep_last)
    return Receipt(path=step_path, step=step, bytes=size, sha256=sha,
                   write_ms=(time.perf_counter() - t0) * 1e3,
                   entry_bytes={n: e["size"] for n, e in manifest["entries"].items()})


def step_files(directory: str) -> list[tuple[int, str]]:
    out = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        m = STEP_RE.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(out)


def rotate(directory: str, keep_last: int) -> None:
    files = step_files(directory)
    for _, path in files[: max(0, len(files) - keep_last)]:
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_stale_temps(directory: str) -> list[str]:
    """Delete temp files a crashed writer left: only sacbot's own, by name pattern."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), TMP_PREFIX + "*")):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def append_receipt(directory: str, record: dict) -> None:
    try:
        with open(os.path.join(directory, "saves.jsonl"), "a") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError:
        pass  # a receipt must never turn a good save into a failure


# --- loading -------------------------------------------------------------------------
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    if info.file_size > limit:
        raise CheckpointError(f"entry {info.filename} is {info.file_size} bytes, over the limit {limit}")
    with zf.open(info) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise CheckpointError(f"entry {info.filename} is larger than its declared size")
    return data


def read_checkpoint(path: str, entries: tuple[str, ...] | None = None) -> dict:
    """Verify and decode a checkpoint.  Returns {"manifest", "arrays", "meta"}.
    Raises CheckpointError, and only CheckpointError, for anything wrong with the file."""
    try:
        return _read_checkpoint(path, entries)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, KeyError,
            TypeError, IndexError, OverflowError, MemoryError, zstandard.ZstdError, MessageError,
            NotImplementedError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None


def _read_checkpoint(path: str, entries: tuple[str, ...] | None) -> dict:
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_ENTRIES:
            raise CheckpointError(f"{path}: {len(infos)} zip entries, at most {MAX_ENTRIES} expected")
        by_name = {}
        for info in infos:
            n = info.filename
            if not _SAFE_NAME.match(n) or n.startswith(".") or ".." in n:
                raise CheckpointError(f"{path}: unsafe entry name {n!r}")
            by_name[n] = info
        if "manifest.json" not in by_name:
            raise CheckpointError(f"{path}: no manifest.json")
        try:
            manifest = json.loads(_read_entry(zf, by_name["manifest.json"], MAX_MANIFEST_BYTES))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: manifest.json is not valid JSON ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format", FORMAT) != FORMAT:
            raise CheckpointError(f"{path}: not a sacbot checkpoint (format {manifest.get('format')!r})")
        version = manifest.get("format_version", 1)  # SPEC: a missing version means 1
        if version == 1:
            from .migrations import read_v1
            return read_v1(path, zf, manifest, by_name)
        if version not in READABLE_VERSIONS:
            raise CheckpointError(f"{path}: format_version {version!r} is not supported "
                                  f"(this sacbot reads {', '.join(map(str, READABLE_VERSIONS))})")
        declared = manifest.get("entries")
        if not isinstance(declared, dict):
            raise CheckpointError(f"{path}: manifest has no entry table")
        for n in by_name:
            if n != "manifest.json" and n not in declared:
                print(f"sacbot: warning: {path}: ignoring unknown entry {n!r}", file=sys.stderr)
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
        for n in want:
            if n not in declared:
                raise CheckpointError(f"{path}: entry {n} is missing from the manifest")
            if n not in by_name:
                raise CheckpointError(f"{path}: entry {n} is listed but absent")
            d = declared[n]
            size, raw_size = int(d["size"]), int(d["raw_size"])
            blob = _read_entry(zf, by_name[n], size)
            if len(blob) != size or hashlib.sha256(blob).hexdigest() != d["sha256"]:
                raise CheckpointError(f"{path}: entry {n} fails its sha256/size check (corrupt)")
            obj = decode_entry(blob, raw_size, path, n)
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
        return {"manifest": manifest, "arrays": arrays, "meta": meta}


def decode_entry(blob: bytes, raw_size: int, path: str, name: str) -> dict:
    if raw_size < 0 or raw_size > MAX_ENTRY_BYTES:
        raise CheckpointError(f"{path}: entry {name} declares {raw_size} bytes, over the cap")
    fcs = zstandard.frame_content_size(blob)
    if fcs != raw_size:
        raise CheckpointError(f"{path}: entry {name} content size {fcs} differs from manifest {raw_size}")
    raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=raw_size)
    obj = unpack(raw, max_size=raw_size + 1)
    if not isinstance(obj, dict) or not isinstance(obj.get("arrays"), dict):
        raise CheckpointError(f"{path}: entry {name} has no array table")
    for k, v in obj["arrays"].items():
        if not isinstance(v, np.ndarray):
            raise CheckpointError(f"{path}: {name}: {k} is not an array")
    return obj


def _check_finite(arrays: dict[str, np.ndarray], path: str) -> None:
    for k, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CheckpointError(f"{path}: {k} holds non-finite values")


def check_shapes(ckpt: dict, expect: dict, path: str) -> None:
    """Raise CheckpointMismatch when the checkpoint's bot does not fit ``expect``: obs_dim and
    act_dim (from the env), and the config fields ``hidden`` and ``quant``, where given."""
    spaces = ckpt["manifest"].get("spaces", {})
    cfg = ckpt["manifest"].get("config", {})
    for key in ("obs_dim", "act_dim"):
        if key in expect and spaces.get(key) != expect[key]:
            raise CheckpointMismatch(f"{path}: {key} is {spaces.get(key)}, the env needs {expect[key]}")
    for key in ("hidden", "quant"):
        if key in expect and cfg.get(key) != expect[key]:
            raise CheckpointMismatch(f"{path} holds a bot with {key} = {cfg.get(key)!r}, "
                                     f"this run asks for {key} = {expect[key]!r}")


def set_aside(path: str) -> str:
    """Rename a bad file to <name>.corrupt-<timestamp>; never delete or overwrite."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dst = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.exists(dst):
        dst = f"{path}.corrupt-{stamp}-{n}"
        n += 1
    os.replace(path, dst)
    return dst


def candidates(directory: str) -> list[str]:
    """Files to try, newest first: sac_latest.zip, then step files by step; but step files newer
    than sac_latest.zip go before it (a crash between writing the step file and copying it to
    sac_latest.zip leaves the latter one save behind)."""
    steps = step_files(directory)[::-1]
    latest = os.path.join(directory, LATEST)
    if not os.path.exists(latest):
        return [p for _, p in steps]
    at = _manifest_step(latest)
    return [p for n, p in steps if at is not None and n > at] + [latest] + \
        [p for n, p in steps if at is None or n <= at]


def _manifest_step(path: str) -> int | None:
    """The step in a checkpoint's manifest, or None if it cannot be read (the full check comes later)."""
    try:
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("manifest.json")
            if info.file_size > MAX_MANIFEST_BYTES:
                return None
            step = json.loads(zf.read(info)).get("step")
        return int(step) if isinstance(step, int) else None
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, AttributeError, EOFError):
        return None


def load_latest(directory: str, expect: dict | None = None, entries: tuple[str, ...] | None = None,
                log=print, set_aside_bad: bool = True) -> tuple[dict, str] | None:
    """Load the newest valid checkpoint; set aside each file that fails, try the next.
    Returns (checkpoint, path) or None when there is no file or none is valid.  A sound file
    that does not fit ``expect`` raises CheckpointMismatch and changes nothing: the run's
    settings are wrong, not the file, and an older step file of the same bot would not fit
    either."""
    for path in candidates(directory):
        try:
            ckpt = read_checkpoint(path, entries)
            if expect:
                check_shapes(ckpt, expect, path)
            log(f"sacbot: loaded checkpoint {path} (step {ckpt['manifest'].get('step')})")
            return ckpt, path
        except CheckpointMismatch:
            raise
        except CheckpointError as e:
            msg = f"sacbot: checkpoint {path} is not usable: {e}"
            if set_aside_bad:
                msg += f"; kept aside as {os.path.basename(set_aside(path))}"
            log(msg)
    return None


def load_actor(path: str) -> dict[str, np.ndarray]:
    """Only the deployable actor, for eval and acting-only processes."""
    ckpt = read_checkpoint(path, entries=("actor",))
    return {k[len("export."):]: v for k, v in ckpt["arrays"].items()}
