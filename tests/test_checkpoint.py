"""Checkpoints: round trip, deterministic digests, corrupt files kept aside with fallback."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import time
import zipfile
from functools import partial

import numpy as np
import pytest
import zstandard
from helpers import build_zip, dir_digests, load_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sacbot.config import Config, ConfigError
from sacbot.learning.replay import CHUNK_MIN_ROWS as C  # rows per replay chunk at the capacities used here
from sacbot.learning.training import TrainingState, handle_message, train_pass
from sacbot.store import checkpoint as ck
from sacbot.wire.messages import make_transition, pack


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
    loaded, path = ck.load_latest(str(tmp_path), {"obs_dim": 3, "act_dim": 1})
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
    _, m1 = build_zip(st.payload(True))
    _, m2 = build_zip(st.payload(True))
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
def test_corrupt_latest_is_kept_aside_and_previous_loads(tmp_path, case, caplog):
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
    caplog.set_level(logging.INFO, logger="sacbot")
    loaded, path = ck.load_latest(str(tmp_path))
    assert path.endswith("sac_step_10.zip") and loaded["meta"]["grad_steps"] == 10
    aside = [f for f in os.listdir(tmp_path) if ".corrupt-" in f]
    assert len(aside) == 2 and any("kept aside" in m for m in caplog.messages)
    assert open(tmp_path / aside[0], "rb").read() == bad  # kept, not deleted or rewritten


@pytest.mark.timeout(30)
def test_a_fifo_in_place_of_the_latest_checkpoint_stops_loading_and_is_not_waited_on(tmp_path):
    """Opening a FIFO blocks until a writer comes, and SIGTERM did not end the wait: `sacbot run`
    and `eval` hung on one named sac_latest.zip.  It is not proven bad bytes either: loading stops
    and leaves it, and the step files, where they are."""
    st = trained_state(tmp_path)
    st.grad_steps = 10
    ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=5)
    os.remove(tmp_path / ck.LATEST)
    os.mkfifo(tmp_path / ck.LATEST)
    with pytest.raises(ck.CheckpointUnreadable, match="not a regular file"):
        ck.read_checkpoint(str(tmp_path / ck.LATEST))
    with pytest.raises(ck.CheckpointUnreadable, match="is a FIFO.*move it out of the way"):
        ck.load_latest(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [ck.LATEST, "sac_step_10.zip"]


def test_unsafe_entry_names_and_pickles_are_refused(tmp_path):
    p = tmp_path / "evil.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("manifest.json", '{"format": "sacbot-checkpoint", "format_version": 2, "entries": {}}')
        zf.writestr("../evil", b"x")
    with pytest.raises(ck.CheckpointError, match="unsafe entry name"):
        ck.read_checkpoint(str(p))
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("manifest.json", pickle.dumps({"format": "x"}))
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(str(p))


def test_stale_temp_files_are_removed_but_nothing_else(tmp_path):
    (tmp_path / ".sacbot-tmp-123-sac_latest.zip").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("keep me")
    removed = ck.remove_stale_temps(str(tmp_path))
    assert len(removed) == 1 and os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.timeout(180)
def test_sigkill_during_continuous_saves_never_loses_the_latest(tmp_path):
    res = load_tool("crash_test").run(kills=30, mb=2.0, seed=1)
    assert res["failures"] == []
    assert res["max_step_reached"] >= 30  # every child completed at least one save


# --- formats and corruption ------------------------------------------------------------
FIXTURE_V1 = os.path.join(os.path.dirname(__file__), "fixtures", "ckpt_v1.zip")


def test_version_1_fixture_loads_through_the_migration():
    c = ck.read_checkpoint(FIXTURE_V1)
    assert c["manifest"]["migrated_from"] == 1 and "alpha" not in c["arrays"]
    cfg = Config(hidden=8, batch_size=2, seq_len=4, learning_starts=2, calib_updates=2, seed=5,
                 critic_layer_norm=False)  # as it was trained: before the setting
    st = TrainingState.fresh(cfg, 3, 1)
    st.load_payload(c["arrays"], c["meta"])
    assert st.grad_steps == 9 and len(st.replay) == 10
    assert float(st.learner.log_alpha.detach()) == pytest.approx(float(c["arrays"]["log_alpha"]))
    handle_message(st, tr(50))
    assert train_pass(st)["grad_steps"] == 1  # and training continues


FIXTURE_V2 = os.path.join(os.path.dirname(__file__), "fixtures", "ckpt_v2.zip")


def test_version_2_fixture_with_its_single_replay_entry_loads():
    c = ck.read_checkpoint(FIXTURE_V2)
    assert c["manifest"]["format_version"] == 2 and "replay.msgpack.zst" in c["manifest"]["entries"]
    expected = np.load(FIXTURE_V2.replace(".zip", "_expected.npz"))
    for k in expected.files:
        assert np.array_equal(c["arrays"][k], expected[k]), k
    cfg = Config(hidden=8, batch_size=2, seq_len=4, learning_starts=2, calib_updates=2, seed=6,
                 critic_layer_norm=False)  # as it was trained: before the setting
    st = TrainingState.fresh(cfg, 3, 1)
    st.load_payload(c["arrays"], c["meta"])
    assert len(st.replay) == 12 and st.grad_steps == 11


def big_replay_state(n: int, capacity: int = 40_000):
    cfg = Config(hidden=8, batch_size=2, seq_len=4, utd_ratio=0.0, calib_updates=2, buffer_size=capacity)
    st = TrainingState.fresh(cfg, 3, 1)
    rng = np.random.default_rng(0)
    for i in range(n):
        st.replay.add(rng.standard_normal(3), [0.5], 1.0, rng.standard_normal(3), False, i % 100 == 99)
    return st


def test_periodic_saves_reencode_only_the_replay_chunks_written_since(tmp_path):
    st = big_replay_state(2 * C + 1000)  # 3 chunks
    cache = ck.ReplayChunkCache()
    first = st.payload(True, since=cache.held())
    assert [c["index"] for c in first["replay_chunks"]] == [0, 1, 2]
    ck.write_checkpoint(str(tmp_path / "a"), first, cache=cache)
    for _ in range(5):  # 5 more rows: chunk 2 only
        st.replay.add(np.ones(3), [0.1], 2.0, np.ones(3), False, False)
    second = st.payload(True, since=cache.held())
    assert [c["index"] for c in second["replay_chunks"]] == [2]
    ck.write_checkpoint(str(tmp_path / "a"), second, cache=cache)
    # The incremental file equals a full save of the same state, entry by entry ...
    _, full = build_zip(st.payload(True))
    inc = ck.read_checkpoint(str(tmp_path / "a" / ck.LATEST))
    assert inc["manifest"]["entries"] == full["entries"]
    assert sorted(n for n in full["entries"] if n.startswith("replay-")) == [
        "replay-000.msgpack.zst", "replay-001.msgpack.zst", "replay-002.msgpack.zst"]
    # ... and loads back into the same buffer.
    other = TrainingState.fresh(st.cfg, 3, 1)
    other.load_payload(inc["arrays"], inc["meta"])
    for k in ("obs", "next_obs", "act", "rew", "terminated", "truncated", "episode"):
        assert np.array_equal(getattr(other.replay, k), getattr(st.replay, k)), k
    assert (other.replay.head, len(other.replay)) == (st.replay.head, len(st.replay)) == (2 * C + 1005,) * 2


def test_a_chunk_the_writer_does_not_hold_fails_the_save_and_is_sent_next_time(tmp_path):
    st = big_replay_state(C + 500)  # 2 chunks
    cache = ck.ReplayChunkCache()
    lying = st.payload(True, since={0: int(st.replay.chunk_gen[0])})  # claims chunk 0 is held
    with pytest.raises(ck.CheckpointError, match="replay chunk 0"):
        ck.write_checkpoint(str(tmp_path), lying, cache=cache)
    assert 0 not in cache.held()
    retry = st.payload(True, since=cache.held())
    assert [c["index"] for c in retry["replay_chunks"]] == [0]  # chunk 1 was encoded and is held
    ck.write_checkpoint(str(tmp_path), retry, cache=cache)
    assert len(ck.read_checkpoint(str(tmp_path / ck.LATEST))["arrays"]["replay.obs"]) == C + 500


def test_a_cleared_buffer_drops_its_old_chunks(tmp_path):
    st = big_replay_state(2 * C + 1000)
    cache = ck.ReplayChunkCache()
    ck.write_checkpoint(str(tmp_path), st.payload(True, since=cache.held()), cache=cache)
    st.replay.clear()
    st.replay.add(np.ones(3), [0.1], 2.0, np.ones(3), False, False)
    p = st.payload(True, since=cache.held())
    assert [c["index"] for c in p["replay_chunks"]] == [0]
    ck.write_checkpoint(str(tmp_path), p, cache=cache)
    c = ck.read_checkpoint(str(tmp_path / ck.LATEST))
    assert [n for n in c["manifest"]["entries"] if n.startswith("replay-")] == ["replay-000.msgpack.zst"]
    assert len(c["arrays"]["replay.obs"]) == 1 and sorted(cache.held()) == [0]


def test_replay_chunks_out_of_order_are_refused(tmp_path):
    st = big_replay_state(2 * C + 1000)
    ck.write_checkpoint(str(tmp_path), st.payload(True))
    src = str(tmp_path / ck.LATEST)

    def drop_chunk_1(items, m):
        del items["replay-001.msgpack.zst"]
        del m["entries"]["replay-001.msgpack.zst"]
    rebuild(src, str(tmp_path / "bad.zip"), entry_edit=drop_chunk_1)
    with pytest.raises(ck.CheckpointError, match="not numbered"):
        ck.read_checkpoint(str(tmp_path / "bad.zip"))


def rebuild(src, dst, manifest_edit=None, entry_edit=None, extra=None):
    """Copy a checkpoint zip, editing the manifest and/or entries (digests left as they were
    unless the edit recomputes them)."""
    with zipfile.ZipFile(src) as zin:
        items = {i.filename: zin.read(i) for i in zin.infolist()}
    manifest = json.loads(items["manifest.json"])
    if manifest_edit:
        manifest_edit(manifest)
    if entry_edit:
        entry_edit(items, manifest)
    items["manifest.json"] = json.dumps(manifest).encode()
    items.update(extra or {})
    with zipfile.ZipFile(dst, "w") as zout:
        for n, b in items.items():
            zout.writestr(n, b)


def reseal(items, manifest, name, blob, raw_size):
    items[name] = blob
    manifest["entries"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob),
                                 "raw_size": raw_size}


@pytest.fixture
def good_dir(tmp_path):
    """A weights dir holding a valid step-10 file and a valid step-20 latest."""
    st = trained_state(tmp_path)
    for step in (10, 20):
        st.grad_steps = step
        ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=5, spaces={"obs_dim": 3, "act_dim": 1},
                            config={"hidden": 8})
    return tmp_path


def _zstd(raw):
    return zstandard.ZstdCompressor().compress(raw)


CORRUPTIONS = {
    "version 0": dict(manifest_edit=lambda m: m.update(format_version=0)),  # a newer one is not damage
    "version a string": dict(manifest_edit=lambda m: m.update(format_version="3")),
    "non-finite weights": dict(entry_edit=lambda items, m: reseal(
        items, m, "model.msgpack.zst",
        _zstd(raw := pack({"arrays": {"actor.fc1.weight": np.array([np.nan], np.float32)}})), len(raw))),
    "../evil entry": dict(extra={"../evil": b"x"}),
    "zip bomb": dict(entry_edit=lambda items, m: reseal(
        items, m, "model.msgpack.zst", _zstd(b"\0" * (64 << 20)), 1000)),  # claims 1 KB, holds 64 MB
    "over the absolute cap": dict(entry_edit=lambda items, m: m["entries"]["model.msgpack.zst"].update(
        raw_size=3 << 30)),
    "pickle payload": dict(entry_edit=lambda items, m: reseal(
        items, m, "model.msgpack.zst", _zstd(raw := pickle.dumps({"arrays": {}})), len(raw))),
    # The manifest has no hash of its own: what readers take from it is checked by type.
    "manifest step a string": dict(manifest_edit=lambda m: m.update(step="abc")),
    "manifest env_steps negative": dict(manifest_edit=lambda m: m.update(env_steps=-5)),
    "manifest config null": dict(manifest_edit=lambda m: m.update(config=None)),
    "manifest obs_dim negative": dict(manifest_edit=lambda m: m["spaces"].update(obs_dim=-1)),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_gives_checkpoint_error_keeps_file_and_falls_back(good_dir, case):
    latest = good_dir / ck.LATEST
    rebuild(latest, good_dir / "bad.zip", **CORRUPTIONS[case])
    os.replace(good_dir / "bad.zip", latest)
    os.unlink(good_dir / "sac_step_20.zip")
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(str(latest))
    loaded, path = ck.load_latest(str(good_dir))
    assert path.endswith("sac_step_10.zip")
    assert any(".corrupt-" in f for f in os.listdir(good_dir))


def test_the_saved_settings_are_read_from_the_file_a_start_would_load_and_nothing_is_moved(good_dir):
    from sacbot.store.load import saved_config

    latest = good_dir / ck.LATEST
    os.unlink(good_dir / "sac_step_20.zip")
    latest.write_bytes(b"not a zip")  # proven bad: a start sets it aside and loads step 10
    before = sorted(os.listdir(good_dir))
    assert saved_config(str(good_dir)) == ({"hidden": 8}, str(good_dir / "sac_step_10.zip"))
    assert sorted(os.listdir(good_dir)) == before
    # A newer format stops a start (nothing older is the bot): no settings are taken from an older file.
    rebuild(good_dir / "sac_step_10.zip", latest, manifest_edit=lambda m: m.update(format_version=99))
    with pytest.raises(ck.CheckpointStop):
        ck.read_checkpoint(str(latest))
    assert saved_config(str(good_dir)) is None and saved_config(str(good_dir / "missing")) is None


@pytest.mark.parametrize("expect,match", [({"obs_dim": 4, "act_dim": 1}, r"obs_dim is 3, the networks' .* needs 4"),
                                          ({"obs_dim": 3, "act_dim": 1, "hidden": 16},
                                           "hidden = 8, this run asks for hidden = 16")])
def test_a_sound_file_that_does_not_fit_the_config_stops_loading_and_is_left_alone(good_dir, expect, match):
    loaded, path = ck.load_latest(str(good_dir), {"obs_dim": 3, "act_dim": 1, "hidden": 8})
    assert path.endswith(ck.LATEST)
    before = sorted(os.listdir(good_dir))
    with pytest.raises(ck.CheckpointMismatch, match=match):
        ck.load_latest(str(good_dir), expect)
    assert sorted(os.listdir(good_dir)) == before  # the settings are wrong, not the files


def test_a_bot_from_another_env_is_named_in_the_mismatch(tmp_path):
    st = trained_state(tmp_path)
    ck.write_checkpoint(str(tmp_path / "w"), st.payload(False), spaces={"obs_dim": 3, "act_dim": 1},
                        config={"hidden": 8, "env": "Pendulum-v1"})
    with pytest.raises(ck.CheckpointMismatch, match=r"needs 37 \(its bot played Pendulum-v1, this run plays "
                                                    r"sacbot/TankDuel-v0\)"):
        ck.load_latest(str(tmp_path / "w"), {"obs_dim": 37, "act_dim": 1, "hidden": 8, "env": "sacbot/TankDuel-v0"})


def test_a_bot_of_another_game_with_the_same_sizes_is_refused_unless_transfer_is_asked_for(tmp_path):
    """Pendulum-v1 and sacbot/CueMemory-v0 both have 3 inputs and 1 action: the sizes alone let a
    mistyped --env train over the Pendulum bot.  So are env kwargs the env declares change what its
    values mean (env_layout); other kwargs (the opponents) and files without the fields still load."""
    st = trained_state(tmp_path)
    layout = {"gun_control": "aim", "observation": "full"}
    ck.write_checkpoint(str(tmp_path / "w"), st.payload(False), config={"hidden": 8, "env": "Pendulum-v1"},
                        spaces={"obs_dim": 3, "act_dim": 1, "env_layout": layout})
    base = {"obs_dim": 3, "act_dim": 1, "hidden": 8}
    before = sorted(os.listdir(tmp_path / "w"))
    load = partial(ck.load_latest, str(tmp_path / "w"))
    with pytest.raises(ck.CheckpointMismatch, match="Pendulum-v1, this run plays sacbot/CueMemory-v0.*--transfer"):
        load({**base, "env": "sacbot/CueMemory-v0"})
    with pytest.raises(ck.CheckpointMismatch, match="gun_control='aim', this run has gun_control='turn'"):
        load({**base, "env": "Pendulum-v1", "env_layout": {**layout, "gun_control": "turn"}})
    assert sorted(os.listdir(tmp_path / "w")) == before  # refused, nothing moved
    assert load({**base, "env": "sacbot/CueMemory-v0", "transfer": True}) is not None
    assert load({**base, "env": "Pendulum-v1", "env_layout": dict(layout)}) is not None
    assert load({**base, "env": "Pendulum-v1"}) is not None  # a caller that gives no layout (the Agent API)
    assert load(base) is not None  # nor an env
    # A layout key both sides do not state is not compared (one added to an env later).
    assert load({**base, "env": "Pendulum-v1", "env_layout": {**layout, "new_key": 1}}) is not None


def test_game_difference_reads_old_checkpoints_as_the_game_they_were_trained_in():
    """Checkpoints from before env_layout was saved: an id saved without its version (sacbot now resolves it
    before saving) is the same game, and a missing env_layout is derived from the saved env and
    kwargs (``layout_of``), as the shipped bot needs."""
    now = {"env": "Pendulum-v1"}
    assert ck.game_difference({"env": "Pendulum"}, {}, now) is None
    assert ck.game_difference({"env": "sacbot/TankDuelRadar"}, {}, {"env": "sacbot/TankDuelRadar-v1"}) is None
    assert "Pendulum-v0, this run plays Pendulum-v1" in ck.game_difference({"env": "Pendulum-v0"}, {}, now)
    assert ck.game_difference({"env": "Pend"}, {}, now) is not None  # a prefix is not the same env
    seen = []
    aim = {"gun_control": "aim"}
    expect = {"env": "sacbot/TankDuel-v0", "env_layout": {"gun_control": "turn"},
              "layout_of": lambda saved: seen.append(saved) or aim}
    old = {"env": "sacbot/TankDuel-v0", "env_kwargs": ""}
    assert "gun_control='aim', this run has gun_control='turn'" in ck.game_difference(old, {}, expect)
    assert seen == [old]
    assert ck.game_difference(old, {"env_layout": {"gun_control": "turn"}}, expect) is None  # saved wins
    assert len(seen) == 1


def test_a_mismatch_found_after_a_damaged_file_says_that_file_was_moved(good_dir):
    """The refusal said "nothing was changed" after renaming the damaged sac_latest.zip."""
    from sacbot.assembly.assemble import _mismatch

    (good_dir / ck.LATEST).write_bytes(b"not a zip")
    with pytest.raises(ck.CheckpointMismatch) as got:
        ck.load_latest(str(good_dir), {"obs_dim": 4, "act_dim": 1, "hidden": 8})
    [moved] = got.value.set_aside
    assert os.path.basename(moved).startswith(ck.LATEST + ".corrupt-") and os.path.exists(moved)
    text = str(_mismatch(Config(weights_path=str(good_dir)), got.value))
    assert "only damaged files were kept aside: " + os.path.basename(moved) in text and "Nothing in" not in text


def test_truncation_at_many_offsets_and_byte_flips_only_raise_checkpoint_error(good_dir, tmp_path):
    data = (good_dir / ck.LATEST).read_bytes()
    rnd = np.random.default_rng(0)
    p = tmp_path / "victim.zip"
    offsets = sorted(set(np.linspace(0, len(data) - 1, 40).astype(int)))
    for off in offsets:
        p.write_bytes(data[:off])
        with pytest.raises(ck.CheckpointError):
            ck.read_checkpoint(str(p))
    for pos in rnd.integers(0, len(data), 40):
        b = bytearray(data)
        b[pos] ^= 1 + int(rnd.integers(0, 255))
        p.write_bytes(bytes(b))
        try:
            ck.read_checkpoint(str(p))  # a flip in zip padding/metadata may be harmless ...
        except ck.CheckpointError:
            pass  # ... anything else must be a CheckpointError (no other exception type escapes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4096))
def test_fuzz_random_bytes_only_raise_checkpoint_error(tmp_path, blob):
    p = tmp_path / "fuzz.zip"
    p.write_bytes(blob)
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(str(p))


_VALID = None


def _valid_bytes():
    global _VALID
    if _VALID is None:
        _VALID = build_zip(trained_state(None).payload(True), spaces={"obs_dim": 3, "act_dim": 1})[0]
    return _VALID


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
       st.one_of(st.none(), st.floats(0, 1)))
def test_fuzz_mutated_valid_files_only_raise_checkpoint_error(tmp_path, edits, cut):
    b = bytearray(_valid_bytes())
    for where, value in edits:
        b[int(where * len(b))] = value
    if cut is not None:
        b = b[: int(cut * len(b))]
    p = tmp_path / "mut.zip"
    p.write_bytes(bytes(b))
    try:
        got = ck.read_checkpoint(str(p))
    except ck.CheckpointError:
        return  # refused: the one other outcome allowed
    # A flip in bytes nothing reads (zip header dates, padding) may leave a file that loads; what
    # it loads must then be the original, bit for bit (a test that cannot fail tests nothing).
    want = _valid_loaded()
    assert got["manifest"] == want["manifest"] and got["meta"] == want["meta"]
    assert got["arrays"].keys() == want["arrays"].keys()
    for k, a in want["arrays"].items():
        assert got["arrays"][k].dtype == a.dtype and np.array_equal(got["arrays"][k], a), k


_VALID_LOADED = None


def _valid_loaded():
    global _VALID_LOADED
    if _VALID_LOADED is None:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "valid.zip")
            with open(p, "wb") as fh:
                fh.write(_valid_bytes())
            _VALID_LOADED = ck.read_checkpoint(p)
    return _VALID_LOADED


def test_the_newest_is_written_before_its_step_file_and_a_newer_step_file_is_refused_not_preferred(tmp_path):
    """The newest checkpoint is written first: a crash before its step copy leaves it ahead of the step
    files, and it loads.  A step file newer than it is a rollback (or a crash of a sacbot that wrote
    the step file first): a training load refuses it naming both ways on, eval plays the newest."""
    st = trained_state(tmp_path, n=6)
    ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=5)
    old_latest = (tmp_path / ck.LATEST).read_bytes()
    for i in range(4):
        handle_message(st, tr(100 + i))
        train_pass(st)
    ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=5)
    newest = f"sac_step_{st.grad_steps}.zip"
    os.unlink(tmp_path / newest)  # a crash between the newest and its step copy
    loaded, path = ck.load_latest(str(tmp_path))
    assert path.endswith(ck.LATEST) and loaded["meta"]["grad_steps"] == st.grad_steps
    ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=5)
    (tmp_path / ck.LATEST).write_bytes(old_latest)  # an older step copied over the newest
    before = dir_digests(tmp_path)
    with pytest.raises(ck.NewerStepFiles, match=rf"holds step 5, but this bot has newer step files: {newest}.*"
                                                rf"move the newer step files out.*copy {newest} over sac_latest"):
        ck.load_latest(str(tmp_path))
    assert dir_digests(tmp_path) == before
    loaded, path = ck.load_latest(str(tmp_path), refuse_newer_steps=False)  # eval
    assert path.endswith(ck.LATEST) and loaded["meta"]["grad_steps"] == 5
    assert ck.candidates(str(tmp_path))[0].endswith(ck.LATEST)


# --- bounded reads: two decompression bombs --------------------------------------------------
AS_LIMIT = 3 << 29  # 1.5 GiB of address space for the reading child: the stated memory bound
RSS_BOUND = 256 << 20  # and its peak RSS (VmHWM) must stay this far below that
SPACES = {"obs_dim": 3, "act_dim": 1}


def small_checkpoint_with_replay() -> tuple[dict, dict]:
    """(members, manifest) of a real checkpoint of a small bot (hidden 8, buffer 64) with a replay."""
    st = trained_state(None)
    data, manifest = build_zip(st.payload(True), config=st.cfg.to_dict() | {"buffer_size": 64}, spaces=SPACES)
    import io
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}, manifest


def _raw_zip(path, members) -> None:
    """Write a zip by hand: ``members`` is [(name, data, method, crc, file_size)], so a member may
    declare a size its data only reaches when inflated (zipfile would compress it itself)."""
    import struct
    central, off = [], 0
    with open(path, "wb") as fh:
        for name, data, method, crc, size in members:
            n = name.encode()
            fh.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), size,
                                 len(n), 0) + n + data)
            central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc,
                                       len(data), size, len(n), 0, 0, 0, 0, 0, off) + n)
            off += 30 + len(n) + len(data)
        cd = b"".join(central)
        fh.write(cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(cd), off, 0))


def _stored(name, data):
    import zlib
    return (name, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data))


def deflate_bomb(path, gib: int = 3) -> None:
    """The first bomb: a ~3 MB zip whose model entry inflates to ``gib`` GiB of zeros.
    Deflate output after a full flush restarts from a clean state, so one compressed 64 MiB block
    repeats: the stream is built in a second, not by deflating gigabytes."""
    import zlib
    members, manifest = small_checkpoint_with_replay()
    zeros = bytes(64 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    n = gib * 16
    stream = block * n + b"\x03\x00"  # + an empty final block
    crc = 0
    for _ in range(n):
        crc = zlib.crc32(zeros, crc)
    size = n * len(zeros)
    manifest["entries"]["model.msgpack.zst"].update(size=size, raw_size=size)
    members["manifest.json"] = json.dumps(manifest).encode()
    _raw_zip(path, [_stored(k, v) for k, v in members.items() if k != "model.msgpack.zst"]
             + [("model.msgpack.zst", stream, zipfile.ZIP_DEFLATED, crc, size)])


def zstd_chunk_bomb(path, chunks: int = 4, mib: int = 512, claim: dict | None = None) -> None:
    """The second bomb: a small checkpoint whose replay is ``chunks`` zstd frames of ``mib``
    MiB each (a zero-filled replay.obs), every digest and size in the manifest correct.  ``claim``
    overrides the manifest's config (a hostile file can claim any bot)."""
    import struct

    import msgpack
    members, manifest = small_checkpoint_with_replay()
    rows = (mib << 20) // 12
    header = msgpack.packb(["<f4", [rows, 3]])
    data_len = rows * 12
    prefix = (b"\x81" + msgpack.packb("arrays") + b"\x81" + msgpack.packb("replay.obs")
              + b"\xc9" + struct.pack(">I", len(header) + data_len) + b"\x01" + header)
    raw_size = len(prefix) + data_len
    cobj = zstandard.ZstdCompressor(level=1, write_content_size=True).compressobj(size=raw_size)
    parts, piece = [cobj.compress(prefix)], bytes(16 << 20)
    left = data_len
    while left:
        parts.append(cobj.compress(piece[:min(left, len(piece))]))
        left -= min(left, len(piece))
    frame = b"".join(parts) + cobj.flush()
    for name in [n for n in members if n.startswith("replay-")]:
        del members[name]
        del manifest["entries"][name]
    for k in range(chunks):
        reseal(members, manifest, f"replay-{k:03d}.msgpack.zst", frame, raw_size)
    manifest["config"].update(claim or {})
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    out = {"deflate 3 GiB": d / "deflate.zip", "zstd 4 x 512 MiB": d / "chunks.zip",
           "zstd 4 x 512 MiB, manifest claims a huge bot": d / "chunks-claim.zip"}
    deflate_bomb(out["deflate 3 GiB"])
    zstd_chunk_bomb(out["zstd 4 x 512 MiB"])
    zstd_chunk_bomb(out["zstd 4 x 512 MiB, manifest claims a huge bot"],
                    claim={"hidden": 4096, "buffer_size": 10**12})
    return out


REFUSAL = {"deflate 3 GiB": "compressed inside the zip",
           "zstd 4 x 512 MiB": "over the byte cap",
           "zstd 4 x 512 MiB, manifest claims a huge bot": "absolute ceiling"}

# Runs the reader under RLIMIT_AS and reports its own peak RSS; the reader is either the CLI
# (`python -m sacbot inspect FILE`) or read_checkpoint (exit 1 on CheckpointError).
BOUNDED_CHILD = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
mode, path = sys.argv[1], sys.argv[2]
code = 0
try:
    if mode == "inspect":
        sys.argv = ["sacbot", "inspect", path]
        runpy.run_module("sacbot", run_name="__main__")
    else:
        from sacbot.store.checkpoint import CheckpointError, read_checkpoint
        try:
            read_checkpoint(path)
            print("loaded")
        except CheckpointError as e:
            print(f"CheckpointError: {{e}}")
            code = 1
except SystemExit as e:
    code = e.code
# VmHWM, not ru_maxrss: Linux carries the forking parent's peak into a child's ru_maxrss at exec.
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print(f"maxrss_kib={{hwm[0]}}", file=sys.stderr)
sys.exit(code)
"""


def run_bounded(mode: str, path, timeout: float = 60) -> tuple[subprocess.CompletedProcess, int]:
    """Returns the child's result and its peak RSS in bytes."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(os.path.join(os.path.dirname(__file__), "..")),
           "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", BOUNDED_CHILD.format(limit=AS_LIMIT), mode, str(path)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    rss = [int(x.split("=")[1]) * 1024 for x in r.stderr.split() if x.startswith("maxrss_kib=")]
    assert rss, r.stderr
    return r, rss[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["inspect", "read_checkpoint"])
def test_both_bombs_are_refused_quickly_within_the_memory_bound(bombs, mode):
    for name, path in bombs.items():
        assert os.path.getsize(path) < 5 << 20, name  # small files ...
        t0 = time.monotonic()
        r, rss = run_bounded(mode, path)
        took = time.monotonic() - t0
        out = r.stdout
        assert r.returncode == 1, (name, r.stdout, r.stderr)
        assert out.startswith("invalid:" if mode == "inspect" else "CheckpointError:"), (name, out)
        assert REFUSAL[name] in out and "MemoryError" not in out, (name, out)  # refused, not exhausted
        assert rss < RSS_BOUND, (name, rss)
        assert took < 30, (name, took)  # ... refused from their declarations, without inflating them


@pytest.mark.timeout(120)
def test_inspect_prints_the_cap_it_applied_and_why(tmp_path):
    st = trained_state(tmp_path)
    ck.write_checkpoint(str(tmp_path), st.payload(True), config=st.cfg.to_dict(), spaces=SPACES)
    r, _ = run_bounded("inspect", tmp_path / ck.LATEST)
    assert r.returncode == 0, r.stdout + r.stderr
    cap = ck.checkpoint_byte_cap(3, 1, st.cfg.hidden, st.cfg.buffer_size)
    assert f"byte cap {cap:,d}" in r.stdout and "derived from the manifest's sizes" in r.stdout
    assert "buffer_size=100000" in r.stdout and "critic_memory=True," in r.stdout
    # A file from before a setting existed shows what its absence means (a refused resume sends users here).
    old = {k: v for k, v in st.cfg.to_dict().items() if k != "critic_memory"}
    ck.write_checkpoint(str(tmp_path / "old"), st.payload(True), config=old, spaces=SPACES)
    r, _ = run_bounded("inspect", tmp_path / "old" / ck.LATEST)
    assert r.returncode == 0 and "critic_memory=True (saved before the setting)" in r.stdout, r.stdout + r.stderr


# --- the byte cap itself ------------------------------------------------------------------
@pytest.mark.parametrize("obs_dim,act_dim,hidden,quant", [(3, 1, 8, "on"), (3, 1, 32, "off"), (17, 2, 16, "on"),
                                                          (1, 1, 1, "on")])
def test_the_derived_cap_holds_a_full_checkpoint_and_is_not_vacuous(obs_dim, act_dim, hidden, quant):
    # A cap below a real file would set a good bot aside as corrupt: the guard against sac.py
    # growing a layer the estimate does not know.  A cap far above it would stop no bomb.
    cfg = Config(hidden=hidden, quant=quant, buffer_size=3000, batch_size=2, seq_len=4, learning_starts=2,
                 calib_updates=2)
    st = TrainingState.fresh(cfg, obs_dim, act_dim)
    rng = np.random.default_rng(0)
    for i in range(cfg.buffer_size + 7):  # full, wrapped
        st.replay.add(rng.standard_normal(obs_dim), rng.uniform(-1, 1, act_dim), 1.0,
                      rng.standard_normal(obs_dim), False, i % 50 == 49)
    st.pending = 3
    train_pass(st)  # Adam moments exist
    _, m = build_zip(st.payload(True), config=cfg.to_dict(), spaces={"obs_dim": obs_dim, "act_dim": act_dim})
    raw = sum(e["raw_size"] for e in m["entries"].values())
    cap = ck.checkpoint_byte_cap(obs_dim, act_dim, hidden, cfg.buffer_size)
    assert ck.byte_cap_for(m).bytes == cap
    assert raw * 1.5 < cap < raw * ck.CAP_FACTOR * 1.3 + ck.CAP_SLACK


def test_a_cap_given_by_the_caller_is_applied_and_clamped_to_the_ceiling(good_dir):
    latest = str(good_dir / ck.LATEST)
    with pytest.raises(ck.CheckpointError, match="over the byte cap 1,000 \\(given by the caller"):
        ck.read_checkpoint(latest, cap=1000)
    c = ck.read_checkpoint(latest, cap=10**15)
    assert c["byte_cap"].bytes == ck.MAX_CHECKPOINT_BYTES and "clamped" in c["byte_cap"].why
    # good_dir's manifests state no buffer_size: the ceiling applies, and says why
    assert "does not state the sizes" in ck.read_checkpoint(latest)["byte_cap"].why


def test_a_version_1_file_over_the_cap_is_refused_before_its_state_is_read(tmp_path):
    def bigger(m):
        m["size"] = 5 << 30
    rebuild(FIXTURE_V1, tmp_path / "v1.zip", manifest_edit=bigger)
    with pytest.raises(ck.CheckpointError, match="version-1 state declares 5,368,709,120 bytes, over the byte cap"):
        ck.read_checkpoint(str(tmp_path / "v1.zip"))


def test_a_zip_member_size_that_disagrees_with_the_manifest_is_refused(good_dir, tmp_path):
    def lie(items, m):
        m["entries"]["model.msgpack.zst"]["size"] += 1
    rebuild(good_dir / ck.LATEST, tmp_path / "bad.zip", entry_edit=lie)
    with pytest.raises(ck.CheckpointError, match="in the zip, .* in the manifest"):
        ck.read_checkpoint(str(tmp_path / "bad.zip"))


# --- what a writer refuses ----------------------------------------------------------------
@pytest.mark.parametrize("where", ["weights", "replay"])
def test_non_finite_arrays_are_never_written(tmp_path, where):
    st = trained_state(tmp_path)
    st.grad_steps = 10
    ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=1)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    st.grad_steps = 20
    p = st.payload(True)
    if where == "weights":
        p["arrays"]["actor.fc1.weight"][0, :2] = [np.nan, np.inf]
    else:
        p["replay_chunks"][0]["arrays"]["replay.rew"][3] = np.inf  # a 1e300 reward, inf in float32
    named = "actor.fc1.weight \\(2 of" if where == "weights" else "replay.rew \\(replay chunk 0\\) \\(1 of"
    with pytest.raises(ck.NonFiniteState, match="refusing to save step 20: 1 array.* hold NaN or inf: " + named):
        ck.write_checkpoint(str(tmp_path), p, keep_last=1)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before  # nothing touched


def test_a_file_over_the_cap_its_readers_apply_is_not_written(tmp_path):
    st = big_replay_state(40_000)  # ~1.7 MB of replay rows
    with pytest.raises(ck.CheckpointError, match="refusing to save step 0: it would hold .* over the cap"):
        ck.write_checkpoint(str(tmp_path), st.payload(True), config={"hidden": 8, "buffer_size": 10}, spaces=SPACES)
    assert os.listdir(tmp_path) == []


def test_rotation_keeps_the_newest_step_file_that_verifies_even_behind_bad_newer_ones(tmp_path):
    st = trained_state(tmp_path)
    for step in (100, 200):
        st.grad_steps = step
        ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=2)
    good = (tmp_path / "sac_step_200.zip").read_bytes()
    # Newer step files that do not verify: a NaN save from before the writer refused them, a torn file.
    rebuild(tmp_path / "sac_step_200.zip", tmp_path / "sac_step_300.zip",
            **CORRUPTIONS["non-finite weights"])
    (tmp_path / "sac_step_400.zip").write_bytes(good[: len(good) // 2])
    ck.rotate(str(tmp_path), keep_last=2)
    assert [s for s, _ in ck.step_files(str(tmp_path))] == [200, 300, 400]  # 100 goes, 200 stays
    assert (tmp_path / "sac_step_200.zip").read_bytes() == good
    ck.rotate(str(tmp_path), keep_last=0)
    assert [s for s, _ in ck.step_files(str(tmp_path))] == [200]
    # A resumed run writes an older step than the bad files: it is kept, as the newest good one.
    st.grad_steps = 250
    (tmp_path / "sac_step_300.zip").write_bytes(good[:100])
    (tmp_path / "sac_step_400.zip").write_bytes(good[:100])
    ck.write_checkpoint(str(tmp_path), st.payload(False), keep_last=2)
    assert [s for s, _ in ck.step_files(str(tmp_path))] == [250, 300, 400]


# --- temps and the one atomic write ---------------------------------------------------------
def test_stale_temps_of_dead_writers_go_and_live_writers_temps_stay(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        names = {"dead": f".sacbot-tmp-{dead.pid}-7-sac_latest.zip", "live": f".sacbot-tmp-{live.pid}-7-sac_latest.zip",
                 "own": f".sacbot-tmp-{os.getpid()}-7-sac_step_5.zip", "old style": f".sacbot-tmp-{dead.pid}-x.zip"}
        for n in names.values():
            (tmp_path / n).write_bytes(b"partial")
        (tmp_path / "notes.txt").write_text("keep me")
        removed = ck.remove_stale_temps(str(tmp_path))
        assert sorted(os.path.basename(p) for p in removed) == sorted([names["dead"], names["old style"]])
        assert sorted(os.listdir(tmp_path)) == sorted([names["live"], names["own"], "notes.txt"])
    finally:
        live.communicate(b"", timeout=30)


@pytest.mark.timeout(60)
def test_two_threads_writing_one_target_never_share_a_temp(tmp_path):
    import threading
    target = str(tmp_path / "status.json")
    blobs = [bytes([65 + i]) * (256 << 10) for i in range(2)]  # big enough for writes to overlap
    errors, start = [], threading.Barrier(2, timeout=30)

    def writer(i):
        try:
            start.wait()
            for _ in range(60):
                ck.atomic_write_bytes(target, blobs[i])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,), name=f"test-writer-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert open(target, "rb").read() in blobs  # whole, from one writer
    assert os.listdir(tmp_path) == ["status.json"]  # no temp left behind


def test_atomic_write_text_replaces_the_file_whole(tmp_path):
    p = tmp_path / "round_counter.txt"
    ck.atomic_write_text(str(p), "41\n")
    ck.atomic_write_text(str(p), "42 ✓\n")
    assert p.read_text(encoding="utf-8") == "42 ✓\n" and os.listdir(tmp_path) == ["round_counter.txt"]
    assert os.path.basename(ck.temp_path(str(p))).startswith(f"{ck.TMP_PREFIX}{os.getpid()}-")


# --- settings changed on resume ---------------------------------------------------------------
@pytest.mark.parametrize("field,now", [("hidden", 16), ("quant", "off"), ("quant_bits", 4), ("memoryless", True),
                                       ("reward_input", True), ("reward_input_squash", "symlog"), ("critic_obs", 1),
                                       ("critic_memory", False), ("critic_layer_norm", False),
                                       ("critic_head_layers", 2), ("critic_head_width", 64)])
def test_each_field_that_changes_the_learner_is_a_mismatch_naming_both_values(good_dir, field, now):
    saved = Config(hidden=8).to_dict()
    assert ck.config_differences(saved, {**saved, field: now}) == [(field, saved[field], now)]
    rebuild(good_dir / ck.LATEST, good_dir / "x.zip", manifest_edit=lambda m: m.update(config=saved))
    c = ck.read_checkpoint(str(good_dir / "x.zip"))
    with pytest.raises(ck.CheckpointMismatch, match=f"{field} = {saved[field]!r}, this run asks for {field} = {now!r}"):
        ck.check_shapes(c, {"obs_dim": 3, "act_dim": 1, **Config(**{"hidden": 8, field: now}).to_dict()}, "x.zip")


def test_a_file_from_before_reward_input_is_named_as_that_setting_not_as_an_obs_dim(good_dir):
    """Saved without the field (so trained without the input), resumed with it on (a preset): the
    message names reward_input, the cause, not only the wider observation it makes."""
    saved = {k: v for k, v in Config(hidden=8).to_dict().items() if k != "reward_input"}
    rebuild(good_dir / ck.LATEST, good_dir / "x.zip", manifest_edit=lambda m: m.update(config=saved))
    c = ck.read_checkpoint(str(good_dir / "x.zip"))
    with pytest.raises(ck.CheckpointMismatch, match="reward_input = False, this run asks for reward_input = True"):
        ck.check_shapes(c, {"obs_dim": 4, "act_dim": 1, **Config(hidden=8, reward_input=True).to_dict()}, "x.zip")
    ck.check_shapes(c, {"obs_dim": 3, "act_dim": 1, **Config(hidden=8).to_dict()}, "x.zip")  # the same bot loads


def test_the_memoryless_control_resumes_whatever_critic_memory_says():
    """The control's critic reads each step alone either way, so a preset that turns critic_memory off
    does not stop an older control run (saved without the field) from resuming; a recurrent one is stopped."""
    saved = {k: v for k, v in Config(hidden=8, memoryless=True).to_dict().items() if k != "critic_memory"}
    assert ck.config_differences(saved, Config(hidden=8, memoryless=True, critic_memory=False).to_dict()) == []
    saved = {k: v for k, v in Config(hidden=8).to_dict().items() if k != "critic_memory"}
    assert ck.config_differences(saved, Config(hidden=8, critic_memory=False).to_dict()) == [
        ("critic_memory", True, False)]


def test_settings_not_given_follow_the_saved_bot_and_an_absent_field_means_its_old_value():
    from sacbot.store.compat import follow_saved

    saved = {k: v for k, v in Config(hidden=8, critic_layer_norm=False).to_dict().items() if k != "critic_layer_norm"}
    now = Config(hidden=32, critic_layer_norm=True, lr=1e-3)
    cfg, changed = follow_saved(now, saved, given=frozenset({"lr"}), path="x.zip")
    assert changed == {"hidden": 8, "critic_layer_norm": False}  # absent: trained before the field, without it
    assert (cfg.hidden, cfg.critic_layer_norm, cfg.lr) == (8, False, 1e-3)  # lr shapes no network: kept
    assert ck.config_differences(saved, cfg.to_dict()) == []
    cfg, changed = follow_saved(now, saved, given=frozenset({"hidden"}), path="x.zip")
    assert changed == {"critic_layer_norm": False} and cfg.hidden == 32  # given: kept, and check_shapes refuses
    assert follow_saved(cfg, saved, given=frozenset(), path="x.zip")[1] == {"hidden": 8}
    with pytest.raises(ConfigError, match=r"x\.zip holds a bot trained with hidden = -3.*hidden"):
        follow_saved(now, {**saved, "hidden": -3}, given=frozenset(), path="x.zip")


def test_other_fields_resume_and_several_differences_are_all_named():
    saved = Config(hidden=8).to_dict()
    changed = Config(hidden=8, buffer_size=5000, batch_size=64, seq_len=8, lr=1e-3, device="cpu", utd_ratio=4.0,
                     calib_updates=10, keep_last=1, env_kwargs='{"opponents": ["spinner"]}').to_dict()
    assert ck.config_differences(saved, changed) == []  # buffer_size included: the newest rows are kept
    # an older file's missing fields: not compared, but for those that shape the network, which mean
    # what that file was trained with (layer norm: off)
    assert ck.config_differences({"hidden": 8}, {**changed, "critic_layer_norm": False}) == []
    assert ck.config_differences({"hidden": 8}, changed) == [("critic_layer_norm", False, True)]
    fp32 = {**saved, "quant": "off"}
    assert ck.config_differences(fp32, {**fp32, "quant_bits": 4}) == []  # an fp32 actor has no grid
    c = {"manifest": {"config": saved, "spaces": SPACES}}
    with pytest.raises(ck.CheckpointMismatch) as e:
        ck.check_shapes(c, {**Config(hidden=32, quant="off").to_dict(), **SPACES}, "f.zip")
    assert "hidden = 8, this run asks for hidden = 32" in str(e.value)
    assert "quant = 'on', this run asks for quant = 'off'" in str(e.value)
