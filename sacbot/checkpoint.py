"""Checkpoint format: a zip of zstd-compressed msgpack entries.

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
is ever unpickled: msgpack decodes with ``raw=False`` and ``strict_map_key``.

Bounded reads, so that a damaged or hostile file cannot exhaust memory: a checkpoint may hold at
most a *byte cap* of decompressed data, derived from the sizes of the bot it holds
(``checkpoint_byte_cap``: learner arrays from ``hidden`` and the spaces, replay rows from
``buffer_size``, twice over plus 1 MiB) and never more than ``MAX_CHECKPOINT_BYTES``.  Every size
the file declares (zip member sizes, the manifest's ``size`` and ``raw_size``, each zstd frame's
content size) is checked against the cap before anything is read, and each decompression is
bounded by it.  A zip member that is itself compressed is refused outright: sacbot
stores its members uncompressed, and a deflated member is how a small file declares gigabytes.
A writer never writes a file its own readers would refuse: ``write_checkpoint`` checks the same cap,
and refuses arrays that hold NaN or inf (``NonFiniteState``).

Rotation keeps the newest step file that verifies, even when newer ones are bad, and stale-temp
cleanup removes only temps of writers that are no longer alive.  One writer per directory is the
caller's job: hold a ``sacbot.lock.WriterLock`` on it.

A bot's files are named from its newest checkpoint's name (``step_name``, ``receipts_name``): ``sac_latest.zip`` owns
``sac_step_<N>.zip`` and ``saves.jsonl``; any other ``<name>.zip`` owns ``<name>.step_<N>.zip`` and
``<name>.saves.jsonl``.  Reading, rotation and receipts touch only the bot's own files, so bots kept as
zips side by side in one folder never see each other's.  The newest checkpoint is written first and
then copied to its step file, so a step file newer than it is never the writer's doing: it is a
rollback (an older file copied over the newest) or a crash of a sacbot that wrote in the other order.
A training start refuses it (``NewerStepFiles``) rather than pick a side; a step file is loaded only
when the newest checkpoint is missing or proven corrupt.

What is set aside as ``*.corrupt-*`` is only what is proven bad: a digest that does not match, a torn
zip, bad msgpack, non-finite arrays, a training state that fails ``check_training_state``.  A file of a
newer format (``CheckpointTooNew``), one the system will not let us read (``CheckpointUnreadable``:
permissions, I/O errors, no file handles or memory left, not a regular file) and a sound file of other
settings (``CheckpointMismatch``) stop loading and leave every file where it was.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import stat
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import zstandard

from .config import STEP_RE
from .files import append_jsonl
from .messages import MessageError, pack, unpack

FORMAT = "sacbot-checkpoint"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
LATEST = "sac_latest.zip"
CHUNK_RE = re.compile(r"^replay-(\d{3})\.msgpack\.zst$")
TMP_PREFIX = ".sacbot-tmp-"
TMP_RE = re.compile(r"^" + re.escape(TMP_PREFIX) + r"(\d+)-")  # the writer's PID
# Absolute ceiling on the decompressed bytes of one checkpoint, whatever its manifest claims.  The
# default bot's checkpoint holds ~20 MB (hidden 64, 100k replay rows); 1 GiB leaves room for a replay
# of ~5M rows of a 20-float observation, while a hostile manifest cannot make a reader allocate more.
MAX_CHECKPOINT_BYTES = 1 << 30
MAX_ENTRY_BYTES = MAX_CHECKPOINT_BYTES  # kept for callers of the old per-entry name
MAX_MANIFEST_BYTES = 1 << 20
FC_HIDDEN = 128  # fc2 width of actor and critic (sacbot.sac.FC_HIDDEN, not imported: torch)
CAP_FACTOR = 2  # the cap is twice the estimate: a margin for layers added later, never a tight fit
CAP_SLACK = 1 << 20  # names, headers, RNG states and counters (a few KB measured), with room to spare
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


class NonFiniteState(CheckpointError):
    """``write_checkpoint`` refused a payload whose arrays hold NaN or inf; nothing was written."""


class CheckpointStop(CheckpointError):
    """The file is not proven bad, but this run cannot use it now.  Never set aside: loading stops
    and every file stays where it was; the message says what to do."""


class CheckpointTooNew(CheckpointStop):
    """Written by a newer sacbot (a higher ``format_version``): upgrade sacbot to read it."""


class CheckpointUnreadable(CheckpointStop):
    """The system will not give us the file's bytes (permissions, I/O error, too many open files,
    no memory, not a regular file, gone while read): the bytes may be sound."""


class NewerStepFiles(CheckpointStop):
    """Step files of this bot are newer than its newest checkpoint (a rollback, or a crash of a sacbot
    that wrote the step file first): training on would write over or rotate away one of the two."""


# --- byte cap ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ByteCap:
    """The most decompressed bytes a read accepts from one checkpoint, and why that many."""
    bytes: int
    why: str


def _learner_floats(obs_dim: int, act_dim: int, hidden: int) -> int:
    """Float count of everything a checkpoint holds for the learner (sacbot/sac.py's layout):
    model (actor, critic, target), Adam's two moments for actor and critic, and the actor export."""
    i, h, f, a = obs_dim + act_dim, hidden, FC_HIDDEN, act_dim
    lstm = 8 * h * h + 8 * h  # w_ih, w_hh (4h x h each) and two 4h biases
    # Actor layers fc1, LSTM, fc2, head, plus their per-channel weight scales and input scales.
    actor = (i * h + h) + lstm + (h * f + f) + (f * 2 * a + 2 * a) + (h + 8 * h + f + 2 * a) + 12
    critic = (i * h + h) + lstm + 2 * (h + a) * f + 2 * f + 2 * f + 2  # core + twin heads
    model, adam, export = actor + 2 * critic + 1, 2 * (actor + critic + 1), actor
    return model + adam + export


def replay_row_bytes(obs_dim: int, act_dim: int) -> int:
    """obs and next_obs, action, reward (float32), terminated, truncated (bool), episode (int64),
    and the many-source layout: source, prev and next (int32 each)."""
    return 4 * (2 * obs_dim + act_dim + 1) + 2 + 8 + 12


def checkpoint_byte_cap(obs_dim: int, act_dim: int, hidden: int, buffer_size: int,
                        replay: bool = True) -> int:
    """The decompressed bytes a checkpoint of this bot may hold: the learner's arrays (from
    ``hidden`` and the spaces) and ``buffer_size`` replay rows, times ``CAP_FACTOR``, plus
    ``CAP_SLACK``.  Not clamped: compare with ``MAX_CHECKPOINT_BYTES`` to see whether such a bot's
    checkpoints can be written at all."""
    est = 4 * _learner_floats(obs_dim, act_dim, hidden)
    if replay:
        est += buffer_size * replay_row_bytes(obs_dim, act_dim)
    return CAP_FACTOR * est + CAP_SLACK


def _int_at_least(x, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def _positive_int(x) -> bool:
    return _int_at_least(x, 1)


def byte_cap_for(manifest: dict, cap: int | None = None) -> ByteCap:
    """The cap a read applies: ``cap`` when the caller gives one, else derived from the sizes the
    manifest's own config and spaces state; never over ``MAX_CHECKPOINT_BYTES``."""
    ceiling = f"the absolute ceiling MAX_CHECKPOINT_BYTES ({MAX_CHECKPOINT_BYTES:,d})"
    if cap is not None:
        if cap >= MAX_CHECKPOINT_BYTES:
            return ByteCap(MAX_CHECKPOINT_BYTES, f"the caller's cap {cap:,d}, clamped to {ceiling}")
        return ByteCap(int(cap), f"given by the caller ({cap:,d} bytes)")
    cfg, spaces = manifest.get("config"), manifest.get("spaces")
    cfg, spaces = cfg if isinstance(cfg, dict) else {}, spaces if isinstance(spaces, dict) else {}
    sizes = {"obs_dim": spaces.get("obs_dim"), "act_dim": spaces.get("act_dim"),
             "hidden": cfg.get("hidden"), "buffer_size": cfg.get("buffer_size")}
    if not all(_positive_int(v) for v in sizes.values()):
        return ByteCap(MAX_CHECKPOINT_BYTES, f"{ceiling}: the manifest does not state the sizes "
                                             "(obs_dim, act_dim, hidden, buffer_size) to derive a cap from")
    derived = checkpoint_byte_cap(**sizes)
    stated = ", ".join(f"{k}={v}" for k, v in sizes.items())
    if derived > MAX_CHECKPOINT_BYTES:
        return ByteCap(MAX_CHECKPOINT_BYTES, f"{ceiling}; the manifest's sizes ({stated}) would allow "
                                             f"{derived:,d}")
    return ByteCap(derived, f"derived from the manifest's sizes ({stated}): learner arrays and "
                            f"replay rows x{CAP_FACTOR}, plus {CAP_SLACK:,d}")


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


def atomic_write_text(path: str, text: str, encoding: str = "utf-8", durable: bool = True) -> None:
    """``atomic_write`` of ``text``; the directory must exist.  ``durable=False`` skips the fsyncs:
    still never torn for a reader, but a power cut may bring back the previous version."""
    data = text.encode(encoding)
    atomic_write(path, lambda fh: fh.write(data), durable=durable)


def temp_path(path: str) -> str:
    """The temp name ``atomic_write`` uses for ``path``: beside it, named for this process (so
    ``remove_stale_temps`` can tell a dead writer's temp from a live one's) and this thread (so
    two threads writing one target never share a temp)."""
    d = os.path.dirname(os.path.abspath(path))
    return os.path.join(d, f"{TMP_PREFIX}{os.getpid()}-{threading.get_native_id()}-{os.path.basename(path)}")


def atomic_write(path: str, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """THE atomic write, the only one in sacbot: ``write(fh)`` into a temp file in the same directory, flush,
    fsync, os.replace, fsync the directory: a crash leaves the old file or the new one, never a mix.
    ``durable=False`` leaves out both fsyncs (for the once-a-second heartbeat, written on the acting
    thread, where an fsync could stall a tick and an older heartbeat after a power cut is harmless)."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
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
    ``sacbot.lock.WriterLock``."""
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


# --- a bot's own files ------------------------------------------------------------------------
RECEIPTS = "saves.jsonl"
_OWNED_STEP_RE = re.compile(r"\.step_\d+\.zip$", re.IGNORECASE)


def _stem(latest_name: str) -> str:
    return latest_name[:-4] if latest_name.lower().endswith(".zip") else latest_name


def step_name(latest_name: str, step: int) -> str:
    """The step file of ``step`` for the bot whose newest checkpoint is ``latest_name``:
    ``sac_step_<N>.zip`` for ``sac_latest.zip`` (the layout every older sacbot wrote), else
    ``<name>.step_<N>.zip``, so bots kept side by side in one folder never share a step file."""
    return f"sac_step_{step}.zip" if latest_name == LATEST else f"{_stem(latest_name)}.step_{step}.zip"


def _step_re(latest_name: str) -> re.Pattern:
    if latest_name == LATEST:
        return STEP_RE
    # Anchored on the whole stem: a.zip's a.step_5.zip is not aa.zip's, nor is aa.step_5.zip a's.
    return re.compile(r"^" + re.escape(_stem(latest_name)) + r"\.step_(\d+)\.zip$")


def receipts_name(latest_name: str = LATEST) -> str:
    """The save receipts of the bot whose newest checkpoint is ``latest_name``."""
    return RECEIPTS if latest_name == LATEST else f"{_stem(latest_name)}.{RECEIPTS}"


def check_latest_name(latest_name: str) -> None:
    """Refuse a newest-checkpoint name that is some bot's step file: every save of one of the two
    would overwrite the other's file."""
    if STEP_RE.match(latest_name) or _OWNED_STEP_RE.search(latest_name):
        other = re.sub(r"[._]step_(\d+)", r"-from-step-\1", _stem(latest_name), flags=re.IGNORECASE)
        raise ValueError(f"{latest_name!r} is the name of a step checkpoint (sac_step_<N>.zip, or <name>.step_<N>.zip "
                         "of the bot <name>.zip), which saves overwrite; name the bot's file otherwise, e.g. "
                         f"{other}.zip")


def step_files(directory: str, latest_name: str = LATEST) -> list[tuple[int, str]]:
    """(step, path) of the step files of the bot whose newest checkpoint is ``latest_name``, oldest
    first; another bot's in the same folder are not listed.  Raises ``CheckpointUnreadable`` when the
    folder exists but cannot be listed."""
    pattern = _step_re(latest_name)
    try:
        names = os.listdir(directory) if os.path.isdir(directory) else []
    except OSError as e:
        raise CheckpointUnreadable(f"{directory}: cannot list the folder ({os.strerror(e.errno) if e.errno else e}); "
                                   f"{_what_to_do(e.errno)}") from None
    out = []
    for name in names:
        m = pattern.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(out)


def _verifies(path: str) -> bool:
    try:
        read_checkpoint(path)
        return True
    except CheckpointError:
        return False


def rotate(directory: str, keep_last: int, verified: tuple[str, ...] = (), latest_name: str = LATEST) -> list[str]:
    """Delete the step files of the bot ``latest_name`` beyond the newest ``keep_last``, but never
    the newest one that passes full verification (otherwise a run of saves with NaN weights would
    rotate the last good file away).  Files are verified newest first and only until one passes; ``verified`` names
    files known good (the one just written).  Another bot's step files are never touched.
    Returns the deleted paths."""
    files = [p for _, p in step_files(directory, latest_name)]
    doomed = files[: max(0, len(files) - keep_last)]
    if not doomed:
        return []
    good = next((p for p in reversed(files) if p in verified or _verifies(p)), None)
    removed = []
    for path in doomed:
        if path == good:
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except (OverflowError, ValueError):
        return False  # not a PID any process can have
    return True


def remove_stale_temps(directory: str) -> list[str]:
    """Delete temp files that crashed writers left: only sacbot's own (by name), and only those of
    writers no longer alive (the PID in the name, checked with ``os.kill(pid, 0)``); never this
    process's own.  A dead writer's PID that the OS has since given to a live process keeps its
    temp until a later cleanup: a leak of one file, never a live writer's file lost.

    Call it only while holding the directory's ``sacbot.lock.WriterLock``: the lock makes this
    process the directory's one writer, and the PID check covers anything else that writes there."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), TMP_PREFIX + "*")):
        m = TMP_RE.match(os.path.basename(path))
        if m and _alive(int(m.group(1))):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def append_receipt(directory: str, record: dict, latest_name: str = LATEST) -> None:
    """One line of the bot's receipts (``receipts_name``: saves.jsonl for sac_latest.zip); a failure
    never turns a good save into a failure."""
    append_jsonl(os.path.join(directory, receipts_name(latest_name)), record)


# --- loading -------------------------------------------------------------------------
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """A member's bytes, never more than ``limit``: refused before reading when it is compressed
    inside the zip or declares more, and read with a bound, so a lying header cannot overrun."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"entry {info.filename} is compressed inside the zip (method "
                              f"{info.compress_type}); sacbot stores entries uncompressed")
    if info.file_size > limit:
        raise CheckpointError(f"entry {info.filename} is {info.file_size:,d} bytes, over the limit {limit:,d}")
    with zf.open(info) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise CheckpointError(f"entry {info.filename} is larger than its declared size")
    return data


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
            from .migrations import read_v1
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


def _check_finite(arrays: dict[str, np.ndarray], path: str) -> None:
    for k, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CheckpointError(f"{path}: {k} holds non-finite values")


# --- the training state, validated like the arrays ---------------------------------------------
# What a resume takes from the "training" entry's meta: TrainingState.load_payload
# (sacbot/training.py), the learner's load_state (sacbot/sac.py), the replay's load
# (sacbot/replay.py) and the acting side's noise state (sacbot/agent.py, acting_rng).  A value a
# resume could not use, or would carry on with (NaN, a negative counter, an RNG state of another
# shape), makes the file invalid here, for `sacbot inspect` and for a resume alike, and a writer
# refuses to write it: otherwise every start fails with a traceback, or the final save writes the
# bad value back.
COUNTER_MAX = 2**63 - 1  # counters are int64 wherever numpy meets them
SOURCE_LIMIT = 2**31  # replay sources, as sacbot.replay.SequenceReplay.add takes them
QUANT_PHASES = ("off", "calibrating", "training")  # sacbot.quant.PHASE_NAMES (torch: not imported here)
MAX_RNG_STATE_CHARS = 4096  # a PCG64 state is ~180 characters of JSON
_REPLAY_KINDS = {"obs": "f", "next_obs": "f", "act": "f", "rew": "f", "terminated": "b", "truncated": "b",
                 "episode": "iu", "source": "iu", "prev": "iu", "next": "iu"}
_REPLAY_LINKS = ("source", "prev", "next")  # absent from checkpoints older than many-source replay


def _is_int(v, lo: int = 0, hi: int = COUNTER_MAX) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _rng_state_problem(key: str, text) -> str | None:
    """Why ``text`` is not the JSON of a numpy default generator's state, or None.  Checked
    field by field (numpy's setter takes 1.5 or True for an integer) and then by numpy itself."""
    if not isinstance(text, str) or len(text) > MAX_RNG_STATE_CHARS:
        return f"{key} = {_shown(text)}, expected the JSON text of a numpy generator state"
    try:
        state = json.loads(text)
    except (ValueError, RecursionError) as e:
        return f"{key} is not JSON ({e})"
    ref = np.random.default_rng(0).bit_generator
    name = type(ref).__name__
    inner = state.get("state") if isinstance(state, dict) else None
    if (not isinstance(state, dict) or state.get("bit_generator") != name or not isinstance(inner, dict)
            or set(inner) != set(ref.state["state"]) or not all(_is_int(v, 0, 2**128 - 1) for v in inner.values())
            or not _is_int(state.get("has_uint32"), 0, 1) or not _is_int(state.get("uinteger"), 0, 2**32 - 1)):
        return f"{key} = {_shown(text)}, expected a {name} state (integer state and inc, has_uint32 0 or 1, uinteger)"
    try:
        ref.state = state
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        return f"{key} is refused by numpy ({e})"
    return None


def _learner_problem(lm, spaces: dict) -> str | None:
    if not isinstance(lm, dict):
        return f"learner = {_shown(lm)}, expected a table of updates, quant_phase, obs_dim, act_dim"
    if not _is_int(lm.get("updates")):
        return f"learner.updates = {_shown(lm.get('updates'))}, expected an integer >= 0"
    if "quant_phase" in lm and lm["quant_phase"] not in QUANT_PHASES:
        return f"learner.quant_phase = {_shown(lm['quant_phase'])}, expected one of {', '.join(QUANT_PHASES)}"
    for key in ("obs_dim", "act_dim"):
        v = lm.get(key)
        if not _is_int(v, 1):
            return f"learner.{key} = {_shown(v)}, expected an integer >= 1"
        if key in spaces and spaces[key] != v:
            return f"learner.{key} = {v}, but the manifest's spaces say {key} = {spaces[key]}"
    return None


def _opponents_problem(meta: dict) -> str | None:
    from .messages import MAX_OPPONENT_CHARS

    def bad_name(v) -> bool:
        return not isinstance(v, str) or len(v) > MAX_OPPONENT_CHARS

    if "opponents" in meta:
        pairs = meta["opponents"]
        if not isinstance(pairs, list):
            return f"opponents = {_shown(pairs)}, expected a list of [source, opponent] pairs"
        seen = set()
        for pair in pairs:
            if (not isinstance(pair, list | tuple) or len(pair) != 2 or not _is_int(pair[0], 0, SOURCE_LIMIT - 1)
                    or bad_name(pair[1]) or pair[0] in seen):
                return (f"opponents holds {_shown(pair)}, expected [source, opponent]: a source in "
                        f"[0, 2**31) once, an opponent name of at most {MAX_OPPONENT_CHARS} characters")
            seen.add(pair[0])
    elif meta.get("opponent") is not None and bad_name(meta["opponent"]):
        return f"opponent = {_shown(meta['opponent'])}, expected a name of at most {MAX_OPPONENT_CHARS} characters"
    return None


def _replay_meta_problem(r) -> tuple[str | None, int]:
    """(why the replay meta cannot be loaded or None, the rows it says are stored)."""
    if not isinstance(r, dict):
        return f"replay = {_shown(r)}, expected a table", 0
    cap, head, size = r.get("capacity"), r.get("head"), r.get("size")
    if not (_is_int(cap, 1) and _is_int(head) and _is_int(size)):
        return (f"replay capacity, head, size = {_shown(cap)}, {_shown(head)}, {_shown(size)}, expected integers "
                "(capacity >= 1)"), 0
    if not (size <= cap and head < cap and size in (head, cap)):
        return (f"replay capacity {cap}, head {head}, size {size} do not fit a ring (0 <= head < capacity, "
                "size is head or capacity)"), 0
    stored = cap if size == cap else head
    if "sources" in r:
        if not _is_int(r.get("next_episode")):
            return f"replay next_episode = {_shown(r.get('next_episode'))}, expected an integer >= 0", stored
        srcs = r["sources"]
        if not isinstance(srcs, list):
            return f"replay sources = {_shown(srcs)}, expected a list of [source, episode, row]", stored
        seen = set()
        for t in srcs:
            if (not isinstance(t, list | tuple) or len(t) != 3 or not _is_int(t[0], 0, SOURCE_LIMIT - 1)
                    or not _is_int(t[1]) or not _is_int(t[2], -1, stored - 1) or t[0] in seen):
                return (f"replay sources holds {_shown(t)}, expected [source in [0, 2**31) once, episode >= 0, "
                        f"row in [-1, {stored})]"), stored
            seen.add(t[0])
    elif not (_is_int(r.get("current_episode")) and isinstance(r.get("episode_open"), bool)):
        return ("replay has neither sources nor a valid current_episode (an integer >= 0) and episode_open "
                "(a bool)"), stored
    if "chunk_rows" in r or "chunk_gens" in r:
        rows, gens = r.get("chunk_rows"), r.get("chunk_gens")
        if not _is_int(rows, 1) or not isinstance(gens, list) or not all(_is_int(g) for g in gens):
            return f"replay chunk_rows, chunk_gens = {_shown(rows)}, {_shown(gens)}, expected integers >= 0", stored
        if len(gens) != -(-stored // rows):
            return (f"replay chunk_gens lists {len(gens)} chunks, {stored} rows of {rows} per chunk make "
                    f"{-(-stored // rows)}"), stored
    return None, stored


def _replay_arrays_problem(arrays: dict, stored: int, obs_dim: int, act_dim: int) -> str | None:
    """The replay arrays against the meta: every row the meta states, of the right kinds and widths,
    links that stay inside the stored rows."""
    have = {k for k in _REPLAY_KINDS if f"replay.{k}" in arrays}
    links = have & set(_REPLAY_LINKS)
    if stored == 0:
        return None if not have else "replay arrays are present, but the replay meta says no rows are stored"
    missing = [k for k in _REPLAY_KINDS if k not in _REPLAY_LINKS and k not in have]
    if missing or links not in (set(), set(_REPLAY_LINKS)):
        absent = (missing or sorted(set(_REPLAY_LINKS) - links))[0]
        return f"replay meta says {stored} rows are stored, but replay.{absent} is missing"
    width = {"obs": obs_dim, "next_obs": obs_dim, "act": act_dim}
    for k in sorted(have):
        a = arrays[f"replay.{k}"]
        want = (stored, width[k]) if k in width else (stored,)
        if a.shape != want or a.dtype.kind not in _REPLAY_KINDS[k]:
            return (f"replay.{k} has shape {a.shape} and dtype {a.dtype}, expected shape {want} of kind "
                    f"{_REPLAY_KINDS[k]}")
    ep = arrays["replay.episode"]
    if ep.size and ep.min() < -1:
        return f"replay.episode holds {ep.min()}, expected -1 (no row) or an episode >= 0"
    if links:
        src = arrays["replay.source"]
        if src.size and (src.min() < 0 or src.max() >= SOURCE_LIMIT):
            return "replay.source holds a source outside [0, 2**31)"
        for k in ("prev", "next"):
            a = arrays[f"replay.{k}"]
            if a.size and (a.min() < -1 or a.max() >= stored):
                return f"replay.{k} links to row {a.min() if a.min() < -1 else a.max()}, outside [-1, {stored})"
    return None


def training_state_problem(meta, manifest: dict | None = None, arrays: dict | None = None,
                           replay_read: bool = False) -> str | None:
    """Why a resume could not use this training meta, or None.  ``manifest`` (its step, env_steps and
    spaces) must agree with it; ``arrays``, when given, are checked where the meta describes them (the
    torch RNG; the replay rows too when ``replay_read``, i.e. the replay entries were read)."""
    if not isinstance(meta, dict):
        return f"meta = {_shown(meta)}, expected a table"
    for key in ("grad_steps", "env_steps", "episodes") + (("passes",) if "passes" in meta else ()):
        if not _is_int(meta.get(key)):
            return f"{key} = {_shown(meta.get(key))}, expected an integer in [0, 2**63)"
    carry = meta.get("utd_carry")
    if not isinstance(carry, int | float) or isinstance(carry, bool) or not math.isfinite(carry) or carry < 0:
        return f"utd_carry = {_shown(carry)}, expected a finite number >= 0 (gradient steps owed)"
    for key in ("rng_numpy",) + (("acting_rng",) if "acting_rng" in meta else ()):
        problem = _rng_state_problem(key, meta.get(key))
        if problem:
            return problem
    problem = _opponents_problem(meta)
    if problem:
        return problem
    manifest = manifest or {}
    spaces = manifest.get("spaces") if isinstance(manifest.get("spaces"), dict) else {}
    lm = meta.get("learner")
    problem = _learner_problem(lm, spaces)
    if problem:
        return problem
    for key, mkey in (("grad_steps", "step"), ("env_steps", "env_steps")):
        if mkey in manifest and manifest[mkey] != meta[key]:
            return f"{key} = {meta[key]}, but the manifest says {mkey} = {manifest[mkey]}"
    if arrays is not None and "rng.torch" in arrays:
        a = arrays["rng.torch"]
        if a.dtype != np.uint8 or a.ndim != 1:
            return f"rng.torch has dtype {a.dtype} and shape {a.shape}, expected a 1-D uint8 generator state"
    if "replay" in meta:
        problem, stored = _replay_meta_problem(meta["replay"])
        if problem:
            return problem
        if arrays is not None and replay_read:
            return _replay_arrays_problem(arrays, stored, lm["obs_dim"], lm["act_dim"])
    return None


def check_training_state(ckpt: dict, path: str, replay_read: bool = True) -> None:
    """Raise CheckpointError, the file's fault, unless its training state is one a resume can use
    (``training_state_problem``).  ``read_checkpoint`` calls it whenever it reads the training entry,
    so `sacbot inspect` and a resume refuse the same files."""
    problem = training_state_problem(ckpt["meta"], ckpt["manifest"], ckpt["arrays"], replay_read)
    if problem:
        raise CheckpointError(f"{path}: training state: {problem} (corrupt: a sacbot writer refuses to write "
                              "this)")


# Config fields whose change makes a saved learner mean something else, with why.  Every other
# field may change on resume: training settings apply from the next update, a smaller or larger
# --buffer-size keeps the newest rows (the loader's job), and --device moves the state.
RESUME_FIELDS = {
    "hidden": "the LSTM and layer shapes",
    "quant": "the actor's layers (quantization-aware or fp32)",
    "quant_bits": "the integer grid the actor's scales were learned for",
    "memoryless": "whether the actor and critic were trained with a recurrent state at all",
    "critic_memory": "whether the critic read the history or each step alone",
    "reward_input": "the networks' inputs (the previous reward is one of them)",
    "critic_obs": "which observation values the actor reads (the rest are the critic's alone)",
}


# A saved config without these fields was trained with this value (the field came later).
ABSENT_MEANS = {"reward_input": False, "critic_obs": 0, "critic_memory": True}


def config_differences(saved_cfg: dict, cfg: dict) -> list[tuple[str, object, object]]:
    """(field, saved value, value now) for each field of ``RESUME_FIELDS`` that differs.  Fields
    absent from either side are not compared (older checkpoints lack newer fields) unless
    ``ABSENT_MEANS`` says what their absence meant, nor are the bits of a saved fp32 actor, which
    has no integer grid, nor the critic's memory between two memoryless controls, which have none."""
    out = []
    saved_cfg = {**{k: v for k, v in ABSENT_MEANS.items() if k in cfg}, **saved_cfg}
    for key in RESUME_FIELDS:
        if key not in saved_cfg or key not in cfg:
            continue
        if key == "quant_bits" and saved_cfg.get("quant", "on") != "on":
            continue
        if key == "critic_memory" and saved_cfg.get("memoryless") and cfg.get("memoryless"):
            continue  # the control's critic reads each step alone either way
        if saved_cfg[key] != cfg[key]:
            out.append((key, saved_cfg[key], cfg[key]))
    return out


def check_shapes(ckpt: dict, expect: dict, path: str) -> None:
    """Raise CheckpointMismatch when the checkpoint's bot does not fit ``expect``: obs_dim and
    act_dim (from the env), and every field of ``RESUME_FIELDS`` that ``expect`` holds (it may
    hold a whole ``Config.to_dict()``; other fields are ignored).  The message names each
    field with both values."""
    spaces = ckpt["manifest"].get("spaces", {})
    cfg = ckpt["manifest"].get("config", {})
    # Settings first: a changed reward_input also changes obs_dim, and the setting is the cause.
    diffs = config_differences(cfg if isinstance(cfg, dict) else {}, expect)
    if diffs:
        raise CheckpointMismatch("; ".join(f"{path} holds a bot with {k} = {saved!r}, this run asks for "
                                           f"{k} = {now!r} ({RESUME_FIELDS[k]} differ)"
                                           for k, saved, now in diffs))
    cfg = cfg if isinstance(cfg, dict) else {}
    game = game_difference(cfg, spaces, expect)
    for key in ("obs_dim", "act_dim"):
        if key in expect and spaces.get(key) != expect[key]:
            what = "the networks' input (the env's obs_dim, + 1 with reward_input)" if key == "obs_dim" else "the env"
            envs = f" (its bot played {game})" if game else ""  # the game is the cause: name it
            raise CheckpointMismatch(f"{path}: {key} is {spaces.get(key)}, {what} needs {expect[key]}{envs}")
    if game and not expect.get("transfer"):
        raise CheckpointMismatch(f"{path} holds a bot that played {game}: its observations and actions would be "
                                 "read as this game's (pass --transfer if that is meant)")


def _same_env(saved: str, now: str) -> bool:
    """The same id, or a saved id without a version that names ``now``'s env (a run given
    ``Pendulum`` saved that, before sacbot resolved it to the ``Pendulum-v1`` gymnasium played)."""
    return saved == now or (re.search(r"-v\d+$", saved) is None and re.fullmatch(re.escape(saved) + r"-v\d+", now)
                            is not None)


def layout_differences(saved: dict | None, now: dict | None) -> list[str]:
    """The layout keys (sacbot.driver.env_layout) whose values differ, sorted; only keys both
    sides state count, so a key an env declares later does not refuse the bots saved before it."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []
    return sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])


def game_difference(saved_cfg: dict, spaces: dict, expect: dict) -> str | None:
    """How the game a checkpoint's bot played differs from the one ``expect`` describes, or None:
    another env id, or a value of the kwargs the env declares change what its values mean
    (``env_layout``, saved in the manifest's spaces; for a checkpoint from before that field,
    ``expect["layout_of"](saved config)`` derives it; ``layout_differences`` compares them)."""
    saved, now = saved_cfg.get("env"), expect.get("env")
    if isinstance(saved, str) and isinstance(now, str) and not _same_env(saved, now):
        return f"{saved}, this run plays {now}"
    now_l = expect.get("env_layout")
    if not isinstance(now_l, dict):
        return None
    saved_l = spaces.get("env_layout")
    if saved_l is None and callable(expect.get("layout_of")):
        saved_l = expect["layout_of"](saved_cfg)
    keys = layout_differences(saved_l, now_l)
    if not keys:
        return None
    return (f"{now} with " + ", ".join(f"{k}={saved_l[k]!r}" for k in keys)
            + ", this run has " + ", ".join(f"{k}={now_l[k]!r}" for k in keys))


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


def candidates(directory: str, latest_name: str = LATEST) -> list[str]:
    """Files to try, in order: the bot's newest checkpoint (``latest_name``), then its own step files,
    newest first (only when the newest is missing or proven corrupt).  Another bot's files in the
    same folder are never listed."""
    steps = [p for _, p in step_files(directory, latest_name)[::-1]]
    latest = os.path.join(directory, latest_name)
    return ([latest] if os.path.exists(latest) else []) + steps


def _refuse_newer_steps(directory: str, latest_name: str, ckpt: dict) -> None:
    """Raise NewerStepFiles when this bot has step files newer than its newest checkpoint."""
    at = ckpt["manifest"].get("step", 0)
    newer = [(n, p) for n, p in step_files(directory, latest_name) if n > at]
    if not newer:
        return
    names = [os.path.basename(p) for _, p in newer]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise NewerStepFiles(
        f"{os.path.join(directory, latest_name)} holds step {at}, but this bot has newer step files: {shown}. "
        "Training on would write over or rotate away one of the two, so sacbot does not choose. To go on "
        f"from {latest_name} (a rollback), move the newer step files out of {directory!r} (for example into a "
        f"folder rolled-back/ inside it); to go on from the newest, copy {names[-1]} over {latest_name}")


def load_latest(directory: str, expect: dict | None = None, entries: tuple[str, ...] | None = None,
                log=print, set_aside_bad: bool = True, latest_name: str = LATEST,
                refuse_newer_steps: bool = True) -> tuple[dict, str] | None:
    """Load the bot's newest valid checkpoint (``candidates``); set aside each file proven corrupt,
    try the next.  Returns (checkpoint, path) or None when there is no file or none is valid.

    Loading stops, changing nothing more, on a file that is not proven bad: a sound file that does
    not fit ``expect`` raises CheckpointMismatch (the run's settings are wrong, not the file, and an
    older step file of the same bot would not fit either); a newer format, a file the system will not
    let us read, and (with ``refuse_newer_steps``, for a run that will write) step files newer than
    the newest checkpoint raise a ``CheckpointStop``.  Either exception's ``set_aside`` lists the
    damaged files moved aside before it."""
    moved: list[str] = []
    latest = os.path.join(directory, latest_name)
    try:
        for path in candidates(directory, latest_name):
            try:
                ckpt = read_checkpoint(path, entries)
                if expect:
                    check_shapes(ckpt, expect, path)
                if refuse_newer_steps and path == latest:
                    _refuse_newer_steps(directory, latest_name, ckpt)
                log(f"sacbot: loaded checkpoint {path} (step {ckpt['manifest'].get('step')})")
                return ckpt, path
            except (CheckpointMismatch, CheckpointStop):
                raise
            except CheckpointError as e:
                msg = f"sacbot: checkpoint {path} is not usable: {e}"
                if set_aside_bad:
                    try:
                        moved.append(set_aside(path))
                    except OSError as err:
                        raise CheckpointUnreadable(f"{e}; it could not be moved aside ({err.strerror or err}): "
                                                   f"{_what_to_do(err.errno)}") from None
                    msg += f"; kept aside as {os.path.basename(moved[-1])}"
                log(msg)
    except (CheckpointMismatch, CheckpointStop) as e:
        e.set_aside = moved  # so a message does not say "nothing was changed" after a rename
        raise
    return None


def load_actor(path: str) -> dict[str, np.ndarray]:
    """Only the deployable actor, for eval and acting-only processes."""
    ckpt = read_checkpoint(path, entries=("actor",))
    return {k[len("export."):]: v for k, v in ckpt["arrays"].items()}
