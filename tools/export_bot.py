#!/usr/bin/env python3
"""Copy a checkpoint without its replay buffer: a small file to ship or share.

The copy keeps the model, optimizer, counters, RNG states and actor export, so it evaluates
(``sacbot eval``), inspects and can be trained on (with an empty replay).  It is written with the
same atomic write and verified by reading it back.

    python tools/export_bot.py runs/td/w/sac_step_40000.zip weights/pretrained/tankduel_sitting_duck.zip

An existing DST is refused unless ``--force`` is given, and never replaced while a sacbot run
holds its directory (it could be that bot's own sac_latest.zip).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sacbot.store import checkpoint as ck  # noqa: E402
from sacbot.store.lock import LOCK_NAME, LockHeld, WriterLock  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    a = p.parse_args()
    if not a.dst.strip():
        p.error("DST is empty; name the file to write, e.g. bot.zip")
    if os.path.abspath(a.src) == os.path.abspath(a.dst) or (
            os.path.exists(a.src) and os.path.exists(a.dst) and os.path.samefile(a.src, a.dst)):
        # --force would replace the bot with its own copy minus the replay: the buffer gone for good.
        p.error(f"SRC and DST are the same file ({a.src!r}); write the copy elsewhere (nothing was written)")
    if os.path.isdir(a.dst):
        p.error(f"DST {a.dst!r} is a directory; name the file to write, e.g. {os.path.join(a.dst, 'bot.zip')!r}")
    if os.path.lexists(a.dst) and not a.force:
        p.error(f"DST {a.dst!r} exists; pass --force to replace it (nothing was written)")
    parent = os.path.dirname(os.path.abspath(a.dst))
    if os.path.exists(parent) and not os.path.isdir(parent):
        p.error(f"DST {a.dst!r}: {parent!r} is not a directory")
    try:
        c = ck.read_checkpoint(a.src)
    except ck.CheckpointError as e:
        print(f"export_bot: {e}", file=sys.stderr)
        return 1
    arrays = {k: v for k, v in c["arrays"].items() if not k.startswith("replay.")}
    meta = {k: v for k, v in c["meta"].items() if k != "replay"}
    m = c["manifest"]
    lock = None
    if os.path.exists(os.path.join(parent, LOCK_NAME)):  # a weights directory: a live bot may be writing there
        try:
            lock = WriterLock(parent).acquire()
        except LockHeld as e:
            print(f"export_bot: {e}; nothing was written", file=sys.stderr)
            return 1
    try:
        with tempfile.TemporaryDirectory() as d:
            r = ck.write_checkpoint(d, {"arrays": arrays, "meta": meta}, keep_last=0,
                                    config=m.get("config"), spaces=m.get("spaces"))
            os.makedirs(parent, exist_ok=True)
            with open(os.path.join(d, ck.LATEST), "rb") as src:  # the one atomic write, fsync included
                ck.atomic_write(a.dst, lambda fh: shutil.copyfileobj(src, fh, 1 << 20))
    except OSError as e:  # no permission, a read-only or full disk, /proc: the atomic write left DST as it was
        print(f"export_bot: cannot write {a.dst!r}: {e.strerror or e}; nothing was written", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.close()
    ck.read_checkpoint(a.dst)  # verify what was written
    print(f"{a.dst}: {r.bytes:,} bytes, step {r.step}, env steps {m.get('env_steps')} (from {a.src})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
