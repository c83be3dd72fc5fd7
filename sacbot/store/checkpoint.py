"""Checkpoint format: a zip of zstd-compressed msgpack entries.  This module is the store's front
door: it documents the format and gives every name of its parts (``format``, ``atomic``, ``write``,
``read``, ``state``, ``compat``, ``weights_dir``, ``load``) under one name.

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
caller's job: hold a ``sacbot.store.lock.WriterLock`` on it.

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

import zipfile  # noqa: F401 - tests reach the zip module through here

from sacbot.store.atomic import (  # noqa: F401
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    temp_path,
)
from sacbot.store.compat import (  # noqa: F401
    ABSENT_MEANS,
    RESUME_FIELDS,
    check_shapes,
    config_differences,
    game_difference,
    layout_differences,
)
from sacbot.store.errors import (  # noqa: F401
    CheckpointError,
    CheckpointMismatch,
    CheckpointStop,
    CheckpointTooNew,
    CheckpointUnreadable,
    NewerStepFiles,
    NonFiniteState,
)
from sacbot.store.format import (  # noqa: F401
    CAP_FACTOR,
    CAP_SLACK,
    CHUNK_RE,
    ENTRIES,
    ENTRY_OF_PREFIX,
    FC_HIDDEN,
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    MAX_CHECKPOINT_BYTES,
    MAX_ENTRIES,
    MAX_ENTRY_BYTES,
    MAX_MANIFEST_BYTES,
    READABLE_VERSIONS,
    TMP_PREFIX,
    TMP_RE,
    ZSTD_LEVEL,
    ByteCap,
    Receipt,
    byte_cap_for,
    checkpoint_byte_cap,
    replay_row_bytes,
    split_payload,
)
from sacbot.store.load import (  # noqa: F401
    load_actor,
    load_latest,
)
from sacbot.store.read import (  # noqa: F401
    decode_entry,
    read_checkpoint,
)
from sacbot.store.state import (  # noqa: F401
    COUNTER_MAX,
    MAX_RNG_STATE_CHARS,
    QUANT_PHASES,
    SOURCE_LIMIT,
    check_training_state,
    training_state_problem,
)
from sacbot.store.weights_dir import (  # noqa: F401
    RECEIPTS,
    append_receipt,
    candidates,
    check_latest_name,
    receipts_name,
    remove_stale_temps,
    rotate,
    set_aside,
    step_files,
    step_name,
)
from sacbot.store.write import (  # noqa: F401
    ReplayChunkCache,
    write_checkpoint,
)
