"""Pretrained bots: where ``sacbot eval`` finds a bot when the weights path holds none of its own.

Two places, in order:

1. ``<weights>/pretrained/*.zip``: bots a person dropped beside their weights;
2. the bots shipped inside the package (``sacbot/bots/*.zip``, package data read through
   ``importlib.resources``), so a plain ``pip install`` or a wheel finds them from any
   working directory.  Their provenance is in ``sacbot/bots/README.md``.

A bot is used only when it was trained on the env being played (its manifest's
``config.env``) and its actor fits the env's spaces.

    found = find(cfg.env, {"obs_dim": 38, "act_dim": 4}, logger, weights_path="weights")
    if found:
        ckpt, path = found
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib import resources
from importlib.resources.abc import Traversable

from sacbot.console import Log
from sacbot.store.compat import check_shapes
from sacbot.store.errors import CheckpointError
from sacbot.store.read import read_checkpoint

PACKAGE_DIR = "bots"  # inside the sacbot package


def shipped_dir() -> Traversable:
    """The folder of bots shipped with the package (a real directory for a normal install)."""
    return resources.files("sacbot").joinpath(PACKAGE_DIR)


@contextmanager
def _candidates(weights_path: str | None) -> Iterator[list[str]]:
    """Paths of every candidate zip, the user's first.  A shipped bot inside a zipped install
    has no file path, so ``as_file`` lends one for as long as the caller reads it."""
    paths: list[str] = []
    d = os.path.join(weights_path, "pretrained") if weights_path else None
    if d and os.path.isdir(d):
        paths += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".zip")]
    bots = shipped_dir()
    shipped = sorted((e for e in bots.iterdir() if e.name.endswith(".zip")), key=lambda e: e.name) \
        if bots.is_dir() else []
    with ExitStack() as stack:
        yield paths + [str(stack.enter_context(resources.as_file(e))) for e in shipped]


def find(env_id: str, expect: dict, logger: Log, weights_path: str | None = None
         ) -> tuple[dict, str] | None:
    """The first pretrained bot trained on ``env_id`` whose actor fits ``expect`` (obs_dim,
    act_dim): ``(checkpoint with the actor entry, its path)``, or None.  A damaged file is
    reported through ``logger`` and skipped, never raised."""
    with _candidates(weights_path) as paths:
        for path in paths:
            try:
                c = read_checkpoint(path, entries=("actor",))
                if c["manifest"].get("config", {}).get("env") != env_id:
                    continue
                check_shapes(c, expect, path)
            except CheckpointError as e:
                logger.warning(f"pretrained bot {path} is not usable: {e}")
                continue
            return c, path
    return None


def provenance(path: str) -> str:
    """Where a pretrained bot's provenance is written: the README beside it."""
    return os.path.join(os.path.dirname(path), "README.md")
