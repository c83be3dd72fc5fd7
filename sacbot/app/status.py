"""``sacbot status RUN_DIR``: the heartbeat as a readable table."""

from __future__ import annotations

import math
import os
import time

from sacbot.store.liveness import read_status

STALE_AFTER_S = 10.0  # the heartbeat is written at least once per second while acting


def _age(t: float | None) -> str:
    if not t:
        return "never"
    s = time.time() - t
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago"


class MalformedStatus(ValueError):
    """status.json holds JSON, but not a heartbeat: the message names the field."""


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


# What each field of the heartbeat (Agent.status) must hold for the table to mean anything.
_FIELDS = {
    "time": (_is_num, "a number (seconds since the epoch)"),
    "started": (lambda v: v is None or _is_num(v), "a number (seconds since the epoch)"),
    **{k: (_is_count, "an integer") for k in ("pid", "ticks", "episodes", "policy_version",
                                              "learner_steps", "buffer_size")},
    "drops": (lambda v: v is None or (isinstance(v, dict) and all(map(_is_num, v.values()))),
              "an object of counts"),
    "last_save": (lambda v: v is None or (isinstance(v, dict) and (v.get("time") is None or _is_num(v["time"]))),
                  "an object with a numeric time"),
    **{k: (lambda v: v is None or isinstance(v, str), "a string") for k in ("mode", "quant_phase",
                                                                             "last_error")},
}


def check_status(st) -> dict:
    """``st`` as read from status.json, or MalformedStatus naming the first bad field."""
    if not isinstance(st, dict):
        raise MalformedStatus(f"holds a JSON {type(st).__name__}, expected an object")
    if "time" not in st:
        raise MalformedStatus("has no 'time' field")
    for key, (ok, what) in _FIELDS.items():
        if key in st and not ok(st[key]):
            raise MalformedStatus(f"{key} = {st[key]!r}, expected {what}")
    return st


def format_status(run_dir: str) -> tuple[str, int]:
    path = os.path.join(run_dir, "status.json")
    st = read_status(path)
    if st is None:
        why = "not valid JSON" if os.path.isfile(path) else "missing or unreadable"
        return f"{run_dir}: no heartbeat ({path} {why})", 1
    try:
        check_status(st)
    except MalformedStatus as e:
        return f"{run_dir}: the heartbeat {path} is malformed: {e}", 1
    age = time.time() - float(st.get("time", 0))
    final = st.get("final_save") if isinstance(st.get("final_save"), dict) else None
    if st.get("closed") is True and final is not None:
        # A run that closed: its heartbeat stops on purpose; finished, with or without its final save.
        state = "finished" if final.get("ok") else "finished, FINAL SAVE FAILED"
    else:
        state = "STALE" if age > STALE_AFTER_S else "live"
    drops = st.get("drops") or {}
    last_save = st.get("last_save") or {}
    rows = [
        ("heartbeat", f"{state} ({age:.1f} s old), pid {st.get('pid')}, mode {st.get('mode')}"),
        ("uptime", f"{(st.get('time', 0) - st.get('started', 0)) / 60:.1f} min"),
        ("episodes", st.get("episodes")),
        ("ticks", st.get("ticks")),
        ("learner steps", st.get("learner_steps")),
        ("policy version", st.get("policy_version")),
        ("buffer", st.get("buffer_size")),
        ("drops", ", ".join(f"{k} {v}" for k, v in drops.items()) or "none"),
        ("quant phase", st.get("quant_phase")),
        ("last save", f"{last_save.get('path')} ({_age(last_save.get('time'))})" if last_save else "none"),
        *([("final save", f"{final.get('path')} ({_age(final.get('time'))})" if final.get("ok") else
            f"failed: {final.get('error') or 'not confirmed'}")] if final else []),
        ("last error", st.get("last_error") or "none"),
    ]
    if "replay_ratio" in st:  # a cluster's learner (sacbot cluster)
        rows.insert(7, ("replay ratio", f"{st.get('replay_ratio')} of {st.get('replay_ratio_target')} "
                                        f"(capacity {st.get('capacity_samples_per_s')} samples/s)"
                                        + ("; BOTS OUTRUN THE LEARNER" if st.get("outrun") else "")))
    bots = st.get("bots")
    if st.get("kind") == "serve":  # sacbot serve: its listeners and one line per bot (ROOT/status.json)
        rows = [r for r in rows if r[0] in ("heartbeat", "uptime", "episodes", "ticks")]
        rows.insert(1, ("listening", "no longer: the server stopped" if st.get("stopped") else
                        ", ".join(map(str, st.get("listen") or [])) or "nothing"))
        rows.append(("connections", f"{st.get('connections')} now, {st.get('refused_connections')} refused"))
        for name, b in sorted((bots or {}).items()):
            if isinstance(b, dict):
                save = b.get("last_save") if isinstance(b.get("last_save"), dict) else {}
                rows.append((f"bot {name}", f"{'connected ' + str(b.get('peer')) if b.get('connected') else 'idle'}"
                                            f", ticks {b.get('ticks')}, episodes {b.get('episodes')}, learner steps "
                                            f"{b.get('learner_steps')}, last save {_age(save.get('time'))}"
                                            + (f", LEARNER ERROR {b['learner_error']}" if b.get("learner_error")
                                               else "")))
        bots = None
    if isinstance(bots, dict):
        for name, b in sorted(bots.items()):
            if isinstance(b, dict):
                rows.append((f"bot{name}", f"pid {b.get('pid')}, ticks {b.get('ticks')}, episodes {b.get('episodes')}"
                                           f", policy lag {b.get('policy_lag')}, restarts {b.get('restarts')}"))
    evals = os.path.join(run_dir, "evals.jsonl")
    if os.path.exists(evals):
        try:
            with open(evals) as fh:
                last = fh.read().strip().splitlines()[-1]
            rows.append(("last eval", last[:120]))
        except (OSError, IndexError):
            pass
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    return text, (0 if state in ("live", "finished") else 1)


def print_status(run_dir: str) -> int:
    text, code = format_status(run_dir)
    print(text)
    return code
