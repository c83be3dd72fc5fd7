"""The checkpoint format: its names, limits and errors, and how arrays become entries.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass

import numpy as np
import zstandard

from sacbot.store.errors import CheckpointError
from sacbot.wire.messages import pack

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
FC_HIDDEN = 128  # fc2 width of actor and critic (sacbot.learning.sac.FC_HIDDEN, not imported: torch)
CAP_FACTOR = 2  # the cap is twice the estimate: a margin for layers added later, never a tight fit
CAP_SLACK = 1 << 20  # names, headers, RNG states and counters (a few KB measured), with room to spare
MAX_ENTRIES = 80  # the fixed entries + up to 64 replay chunks
ZSTD_LEVEL = 3  # measured in BENCHMARKS.md: level 3 is ~as small as 9 on weights, far faster

ENTRY_OF_PREFIX = (("actor.", "model"), ("critic.", "model"), ("target.", "model"),
                   ("log_alpha", "model"), ("opt.", "optimizer"), ("rng.", "training"),
                   ("replay.", "replay"), ("export.", "actor"))
ENTRIES = ("model", "optimizer", "training", "replay", "actor")


# --- byte cap ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ByteCap:
    """The most decompressed bytes a read accepts from one checkpoint, and why that many."""
    bytes: int
    why: str


def _learner_floats(obs_dim: int, act_dim: int, hidden: int) -> int:
    """Float count of everything a checkpoint holds for the learner (sacbot/learning/sac.py's layout):
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
    from sacbot import __version__
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


def _check_finite(arrays: dict[str, np.ndarray], path: str) -> None:
    for k, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CheckpointError(f"{path}: {k} holds non-finite values")
