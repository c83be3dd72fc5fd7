"""Finding and loading the newest checkpoint of a weights directory that verifies.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection

import numpy as np

from sacbot.config import Config
from sacbot.console import Log
from sacbot.store.compat import check_shapes, follow_saved
from sacbot.store.errors import (
    CheckpointError,
    CheckpointMismatch,
    CheckpointStop,
    CheckpointUnreadable,
    NewerStepFiles,
)
from sacbot.store.format import LATEST
from sacbot.store.read import _what_to_do, read_checkpoint
from sacbot.store.weights_dir import candidates, set_aside, step_files


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
                logger: Log | None = None, set_aside_bad: bool = True, latest_name: str = LATEST,
                refuse_newer_steps: bool = True) -> tuple[dict, str] | None:
    """Load the bot's newest valid checkpoint (``candidates``); set aside each file proven corrupt,
    try the next.  Returns (checkpoint, path) or None when there is no file or none is valid.

    Loading stops, changing nothing more, on a file that is not proven bad: a sound file that does
    not fit ``expect`` raises CheckpointMismatch (the run's settings are wrong, not the file, and an
    older step file of the same bot would not fit either); a newer format, a file the system will not
    let us read, and (with ``refuse_newer_steps``, for a run that will write) step files newer than
    the newest checkpoint raise a ``CheckpointStop``.  Either exception's ``set_aside`` lists the
    damaged files moved aside before it."""
    logger = logger or logging.getLogger("sacbot")
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
                logger.info(f"loaded checkpoint {path} (step {ckpt['manifest'].get('step')})")
                return ckpt, path
            except (CheckpointMismatch, CheckpointStop):
                raise
            except CheckpointError as e:
                msg = f"checkpoint {path} is not usable: {e}"
                if set_aside_bad:
                    try:
                        moved.append(set_aside(path))
                    except OSError as err:
                        raise CheckpointUnreadable(f"{e}; it could not be moved aside ({err.strerror or err}): "
                                                   f"{_what_to_do(err.errno)}") from None
                    msg += f"; kept aside as {os.path.basename(moved[-1])}"
                logger.warning(msg)
    except (CheckpointMismatch, CheckpointStop) as e:
        e.set_aside = moved  # so a message does not say "nothing was changed" after a rename
        raise
    return None


def saved_config(directory: str, latest_name: str = LATEST) -> tuple[dict, str] | None:
    """(the saved config, its path) of the checkpoint a start would load first: the newest in
    ``directory`` that reads (its actor and manifest only); None when there is none, when it has
    no config, or when a file stops loading (a newer format, one the system will not read).  Moves
    nothing; ``load_latest`` later judges the files and says what is wrong with them."""
    try:
        paths = candidates(directory, latest_name)
    except (CheckpointError, OSError):
        return None
    for path in paths:
        try:
            cfg = read_checkpoint(path, entries=("actor",))["manifest"].get("config")
        except CheckpointStop:
            return None  # loading stops here too: no older file's settings are the bot's
        except (CheckpointError, OSError):
            continue
        return (cfg, path) if isinstance(cfg, dict) else None
    return None


def follow_saved_bot(cfg: Config, given: Collection[str] | None,
                     found: tuple[dict, str] | None = None) -> tuple[Config, str, str]:
    """``cfg`` going on with the bot saved in its weights path (``found``, else ``saved_config``):
    the settings that shape its networks that the user did not give (``given``; None: nothing
    follows) as it was trained (``follow_saved``).  Returns the config, a line saying what followed
    ("" when nothing did) and the file read ("" when none)."""
    if given is None:
        return cfg, "", ""
    found = found or saved_config(cfg.weights_dir, cfg.latest_name)
    if found is None:
        return cfg, "", ""
    cfg, changed = follow_saved(cfg, found[0], given, found[1])
    said = ", ".join(f"{k}={v}" for k, v in changed.items())
    return cfg, (f"{said} as it was trained (the settings that shape its networks follow the saved bot unless "
                 "you give them)" if changed else ""), found[1]


def load_actor(path: str) -> dict[str, np.ndarray]:
    """Only the deployable actor, for eval and acting-only processes."""
    ckpt = read_checkpoint(path, entries=("actor",))
    return {k[len("export."):]: v for k, v in ckpt["arrays"].items()}
