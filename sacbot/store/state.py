"""The training state of a checkpoint, validated like its arrays, before anything is resumed.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import json
import math

import numpy as np

from sacbot.store.errors import CheckpointError

# --- the training state, validated like the arrays ---------------------------------------------
# What a resume takes from the "training" entry's meta: TrainingState.load_payload
# (sacbot/learning/training.py), the learner's load_state (sacbot/learning/sac.py), the replay's load
# (sacbot/learning/replay.py) and the acting side's noise state (sacbot/acting/agent.py, acting_rng).  A value a
# resume could not use, or would carry on with (NaN, a negative counter, an RNG state of another
# shape), makes the file invalid here, for `sacbot inspect` and for a resume alike, and a writer
# refuses to write it: otherwise every start fails with a traceback, or the final save writes the
# bad value back.
COUNTER_MAX = 2**63 - 1  # counters are int64 wherever numpy meets them
SOURCE_LIMIT = 2**31  # replay sources, as sacbot.learning.replay.SequenceReplay.add takes them
QUANT_PHASES = ("off", "calibrating", "training")  # sacbot.learning.quant.PHASE_NAMES (torch: not imported here)
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
    from sacbot.wire.messages import MAX_OPPONENT_CHARS

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
