"""Checkpoints: round trip, deterministic digests, corrupt files kept aside with fallback."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from sacbot import checkpoint as ck
from sacbot.config import Config
from sacbot.messages import make_transition
from sacbot.training import TrainingState, handle_message, train_pass


def tr(i=0.0, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], False, trunc, obs_dim=3, act_dim=1)


def trained_state(tmp_path, n=12):
    cfg = Config(hidden=8, batch_size=2, seq_len=4, learning_starts=2, calib_updates=2)
    st = TrainingState.fresh(cfg, 3, 1)
    for i in range(n):
        handle_message(st, tr(i, trunc=i % 5 == 4))
        train_pass(st)
    return st


def test_round_trip_restores_parameters_optimizer_rng_and_replay(tmp_path):
    st = trained_state(tmp_path)
    ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=2, spaces={"obs_dim": 3, "act_dim": 1})
    loaded, path = ck.load_latest(str(tmp_path), {"obs_dim": 3, "act_dim": 1}, log=lambda m: None)
    assert path.endswith(ck.LATEST)
    other = TrainingState.fresh(st.cfg, 3, 1)
    other.load_payload(loaded["arrays"], loaded["meta"])
    a, _ = st.learner.state()
    b, _ = other.learner.state()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert other.rng.bit_generator.state == st.rng.bit_generator.state
    assert len(other.replay) == len(st.replay) == 12
    # and training continues identically
    for s in (st, other):
        handle_message(s, tr(99))
        train_pass(s)
    a, _ = st.learner.state()
    b, _ = other.learner.state()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_same_state_gives_same_entry_digests(tmp_path):
    st = trained_state(tmp_path)
    _, m1 = ck.build_zip(st.payload(True))
    _, m2 = ck.build_zip(st.payload(True))
    assert {n: e["sha256"] for n, e in m1["entries"].items()} == {n: e["sha256"] for n, e in m2["entries"].items()}


def test_rotation_keeps_latest_plus_last_n(tmp_path):
    st = trained_state(tmp_path)
    for step in range(1, 8):
        st.grad_steps = step
        ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=3)
    assert [s for s, _ in ck.step_files(str(tmp_path))] == [5, 6, 7]
    assert os.path.exists(tmp_path / ck.LATEST)


def _corrupt_cases(data: bytes):
    yield "truncated", data[: len(data) // 2]
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF
    yield "byte flip", bytes(flipped)
    yield "not a zip", b"hello"


@pytest.mark.parametrize("case", ["truncated", "byte flip", "not a zip"])
def test_corrupt_latest_is_kept_aside_and_previous_loads(tmp_path, case):
    st = trained_state(tmp_path)
    st.grad_steps = 10
    ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=5)
    st.grad_steps = 20
    ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=5)
    latest = tmp_path / ck.LATEST
    bad = dict(_corrupt_cases(latest.read_bytes()))[case]
    latest.write_bytes(bad)
    (tmp_path / "sac_step_20.zip").write_bytes(bad)
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(str(latest))
    logs = []
    loaded, path = ck.load_latest(str(tmp_path), log=logs.append)
    assert path.endswith("sac_step_10.zip") and loaded["meta"]["grad_steps"] == 10
    aside = [f for f in os.listdir(tmp_path) if ".corrupt-" in f]
    assert len(aside) == 2 and any("kept aside" in m for m in logs)
    assert open(tmp_path / aside[0], "rb").read() == bad  # kept, not deleted or rewritten


def test_unsafe_entry_names_and_pickles_are_refused(tmp_path):
    p = tmp_path / "evil.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("manifest.json", '{"format": "sacbot-checkpoint", "format_version": 2, "entries": {}}')
        zf.writestr("../evil", b"x")
    with pytest.raises(ck.CheckpointError, match="unsafe entry name"):
        ck.read_checkpoint(str(p))
    import pickle
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("manifest.json", pickle.dumps({"format": "x"}))
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(str(p))


def test_stale_temp_files_are_removed_but_nothing_else(tmp_path):
    (tmp_path / ".sacbot-tmp-123-sac_latest.zip").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("keep me")
    removed = ck.remove_stale_temps(str(tmp_path))
    assert len(removed) == 1 and os.listdir(tmp_path) == ["notes.txt"]
