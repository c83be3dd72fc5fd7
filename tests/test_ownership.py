"""Nothing a user does loses a bot, for the checkpoint files: a bot's files belong to that bot, only
proven corruption is set aside, and everything read from a checkpoint is validated.  Each test
reproduces a case that lost a bot, set a sound file aside, or let every resume crash, before these
rules held."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import zstandard
from helpers import ACT_SPACE, OBS_SPACE, dir_digests, play, small_cfg

from sacbot import Agent
from sacbot.acting.agent import AgentError
from sacbot.config import Config, ConfigError
from sacbot.learning.training import TrainingState, handle_message, train_pass
from sacbot.store import checkpoint as ck
from sacbot.store import load as ck_load
from sacbot.wire.messages import make_transition, pack, unpack

pytestmark = pytest.mark.timeout(240)
SACBOT = [sys.executable, "-m", "sacbot"]
# A small bot: a few hundred lockstep steps take seconds.
SMALL = ["--env", "Pendulum-v1", "--hidden", "32", "--batch-size", "8", "--seq-len", "8", "--learning-starts", "64",
         "--pace", "lockstep", "--quiet"]
SPACES = {"obs_dim": 3, "act_dim": 1}


def sacbot(cwd, *args, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SACBOT_", "SACLSTM_"))}
    return subprocess.run(SACBOT + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})}, cwd=cwd)


def meta_of(path) -> dict:
    return ck.read_checkpoint(str(path), entries=("training",))["meta"]


def trained(n: int = 12, seed: int = 0) -> TrainingState:
    cfg = Config(hidden=8, batch_size=2, seq_len=4, learning_starts=2, calib_updates=2, seed=seed)
    st = TrainingState.fresh(cfg, 3, 1)
    for i in range(n):
        handle_message(st, make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], False, i % 5 == 4, obs_dim=3,
                                           act_dim=1))
        train_pass(st)
    return st


def edit_entry(path, name: str, edit) -> None:
    """Change one decoded entry of a checkpoint and reseal it: its sha256, size and raw size are
    right again, so only the content is wrong."""
    with zipfile.ZipFile(path) as z:
        items = {i.filename: z.read(i) for i in z.infolist()}
    manifest = json.loads(items["manifest.json"])
    obj = unpack(zstandard.ZstdDecompressor().decompress(items[name]))
    edit(obj)
    raw = pack(obj)
    blob = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    items[name] = blob
    manifest["entries"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "raw_size": len(raw)}
    items["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in items.items():
            z.writestr(n, b)


def edit_meta(path, **changes) -> None:
    edit_entry(path, "training.msgpack.zst", lambda obj: obj["meta"].update(changes))


def edit_manifest(path, **changes) -> None:
    with zipfile.ZipFile(path) as z:
        items = {i.filename: z.read(i) for i in z.infolist()}
    manifest = json.loads(items["manifest.json"])
    manifest.update(changes)
    items["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in items.items():
            z.writestr(n, b)


# --- a bot's files belong to that bot --------------------------------------------------------
@pytest.mark.timeout(600)
def test_two_bots_kept_as_zips_in_one_folder_keep_their_own_files(tmp_path):
    """The original's layout: the weights path names the zip.  b loaded a's newest step file and went
    on from a's state; then a loaded b's, a.zip was overwritten, and rotation deleted a's step files."""
    a = {"SACLSTM_WEIGHTS_PATH": "models/a.zip"}
    b = {"SACLSTM_WEIGHTS_PATH": "models/b.zip"}
    p = sacbot(tmp_path, "run", *SMALL, "--steps", 300, "--save-interval", 100, "--run-dir", "ra", env=a)
    assert p.returncode == 0, p.stderr
    models = tmp_path / "models"
    assert meta_of(models / "a.zip")["env_steps"] == 300
    a_files = dir_digests(models)  # all a's so far, its round counter included

    p = sacbot(tmp_path, "run", *SMALL, "--seed", 7, "--steps", 300, "--save-interval", 100, "--run-dir", "rb",
               env=b)
    assert p.returncode == 0, p.stderr
    assert meta_of(models / "b.zip")["env_steps"] == 300  # 600 had it gone on from a's state
    assert {f: d for f, d in dir_digests(models).items() if f in a_files} == a_files
    a_steps = sorted(f for f in a_files if f.startswith("a.step_"))
    assert a_steps and set(a_files) == {"a.zip", "a.saves.jsonl", "a.round_counter.txt", *a_steps}
    b_files = {f: d for f, d in dir_digests(models).items() if f.startswith("b.")}
    assert any(f.startswith("b.step_") for f in b_files) and "b.saves.jsonl" in b_files

    p = sacbot(tmp_path, "run", *SMALL, "--steps", 10, "--run-dir", "ra", env=a)
    assert p.returncode == 0, p.stderr
    assert meta_of(models / "a.zip")["env_steps"] == 310  # its own state, not b's
    assert set(a_steps) <= set(os.listdir(models))  # a's earlier step files: none rotated away
    assert {f: d for f, d in dir_digests(models).items() if f.startswith("b.")} == b_files
    assert not [f for f in os.listdir(models) if f.startswith("sac_") or ".corrupt-" in f or f == "saves.jsonl"
                or f == "round_counter.txt"]
    # each bot counts its own rounds (Pendulum: one 200-step episode in 300 steps; a shared counter
    # would read 2) and writes its own metrics file
    assert int((models / "a.round_counter.txt").read_text()) == 1
    assert int((models / "b.round_counter.txt").read_text()) == 1
    assert {f for f in os.listdir(tmp_path) if f.endswith("training_metrics.jsonl")} == {
        "a.training_metrics.jsonl", "b.training_metrics.jsonl"}
    for bot in ("a", "b"):  # each bot's receipts name its own step files only
        receipts = [json.loads(x) for x in open(models / f"{bot}.saves.jsonl")]
        assert receipts and all(os.path.basename(r["path"]).startswith(f"{bot}.step_") for r in receipts)


@pytest.mark.timeout(600)
def test_a_step_file_copied_over_the_latest_is_never_silently_undone(tmp_path):
    """A user rolls back by copying sac_step_100.zip over sac_latest.zip.  The next start loaded the
    newer step file instead, and the rollback was gone.  Now training refuses, naming both ways on
    and changing nothing; eval plays the rolled-back bot; moving the newer files away resumes it."""
    w = tmp_path / "w"
    p = sacbot(tmp_path, "run", *SMALL, "--weights-path", w, "--steps", 300, "--save-interval", 100,
               "--run-dir", "r")
    assert p.returncode == 0, p.stderr
    steps = sorted(ck.step_files(str(w)))
    assert len(steps) >= 2
    old_step, old = steps[0]
    shutil.copyfile(old, w / ck.LATEST)
    old_env_steps = meta_of(old)["env_steps"]
    before = dir_digests(w)

    p = sacbot(tmp_path, "run", *SMALL, "--weights-path", w, "--steps", 10, "--run-dir", "r")
    assert p.returncode == 1, p.stderr
    newer = ", ".join(os.path.basename(q) for _, q in steps[1:4])
    assert f"holds step {old_step}, but this bot has newer step files: {newer}" in p.stderr
    assert "move the newer step files out" in p.stderr and f"Nothing in {str(w)!r} was changed" in p.stderr
    assert dir_digests(w) == before

    p = sacbot(tmp_path, "eval", *SMALL, "--weights-path", w, "--episodes", 1, "--run-dir", "e")
    assert p.returncode == 0, p.stderr
    assert f"(checkpoint {w / ck.LATEST})" in p.stdout  # eval writes nothing: it plays the rollback

    os.makedirs(w / "rolled-back")
    for _, q in steps[1:]:
        shutil.move(q, w / "rolled-back")
    p = sacbot(tmp_path, "run", *SMALL, "--weights-path", w, "--steps", 10, "--run-dir", "r")
    assert p.returncode == 0, p.stderr
    assert meta_of(w / ck.LATEST)["env_steps"] == old_env_steps + 10
    assert sorted(os.listdir(w / "rolled-back")) == sorted(os.path.basename(q) for _, q in steps[1:])


def test_bots_whose_names_share_a_prefix_never_touch_each_others_files(tmp_path):
    """Four bots in one folder, three of them named alike (a, aa, a.b) and one in sacbot's own
    layout: each reads, rotates and receipts only its own files, also with --keep-last 0."""
    d = str(tmp_path)
    names = {"a.zip": "a.step_{}.zip", "aa.zip": "aa.step_{}.zip", "a.b.zip": "a.b.step_{}.zip",
             ck.LATEST: "sac_step_{}.zip"}
    st = trained(6)
    for rnd in range(4):
        for i, name in enumerate(names):
            st.grad_steps = 100 * rnd + 10 * i + 1
            ck.write_checkpoint(d, st.payload(False), keep_last=2, latest_name=name)
    for i, name in enumerate(names):
        loaded, path = ck.load_latest(d, latest_name=name)
        assert path == os.path.join(d, name) and loaded["meta"]["grad_steps"] == 300 + 10 * i + 1
    for rnd in range(4):
        for i, name in enumerate(names):
            ck.append_receipt(d, {"step": 100 * rnd + 10 * i + 1}, name)
    expected: set[str] = set()
    for i, (name, steps) in enumerate(names.items()):
        own = [steps.format(100 * r + 10 * i + 1) for r in (2, 3)]  # keep_last=2 of its own
        assert [os.path.basename(p) for _, p in ck.step_files(d, name)] == own
        assert ck.candidates(d, name) == [os.path.join(d, f) for f in [name, *own[::-1]]]
        receipts = "saves.jsonl" if name == ck.LATEST else name[:-4] + ".saves.jsonl"
        assert [json.loads(x)["step"] for x in open(os.path.join(d, receipts))] == [100 * r + 10 * i + 1
                                                                                    for r in range(4)]
        expected |= {name, receipts, *own}
    assert set(os.listdir(d)) == expected  # nothing else written, nothing of one bot rotated by another
    others = {f: h for f, h in dir_digests(tmp_path).items() if not f.startswith("a.step_") and f != "a.zip"}
    st.grad_steps = 999
    ck.write_checkpoint(d, st.payload(False), keep_last=0, latest_name="a.zip")
    assert [os.path.basename(p) for _, p in ck.step_files(d, "a.zip")] == ["a.step_999.zip"]
    assert {f: h for f, h in dir_digests(tmp_path).items() if not f.startswith("a.step_") and f != "a.zip"} == others


@pytest.mark.parametrize("name", ["a.step_5.zip", "bot.STEP_12.ZIP"])
def test_a_bot_named_as_another_bots_step_file_is_refused_for_training(tmp_path, name):
    """a.zip's saves write a.step_5.zip: a bot of that name would be overwritten by them."""
    cfg = small_cfg(tmp_path, weights_path=str(tmp_path / "models" / name))
    with pytest.raises(ConfigError, match=r"is the name of a step checkpoint.*name the bot's file otherwise"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert not os.path.exists(tmp_path / "models")  # refused before anything was made


# --- only proven corruption is set aside ------------------------------------------------------
@pytest.fixture
def two_saves(tmp_path):
    """A weights dir: step 10 and step 20 (the newest) of one small bot, with its replay."""
    st = trained()
    for step in (10, 20):
        st.grad_steps = step
        ck.write_checkpoint(str(tmp_path), st.payload(True), keep_last=5, spaces=SPACES, config={"hidden": 8})
    return tmp_path


@pytest.mark.timeout(300)
def test_a_checkpoint_of_a_newer_format_stops_the_run_and_is_left_as_it_is(tmp_path):
    """What a downgrade meets: the newer sacbot's files were renamed *.corrupt-* and the bot started
    from scratch, exit 0."""
    cfg = small_cfg(tmp_path, pace="lockstep")
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 20)
    w = tmp_path / "w"
    edit_manifest(w / ck.LATEST, format_version=ck.FORMAT_VERSION + 1, sacbot_version="9.0.0")
    before = dir_digests(w)
    with pytest.raises(ck.CheckpointError, match="newer sacbot") as e:
        ck.read_checkpoint(str(w / ck.LATEST))
    p = sacbot(tmp_path, "run", "--hidden", 8, "--weights-path", w, "--steps", 10, "--run-dir", tmp_path / "r",
               "--quiet", timeout=120)
    assert p.returncode == 1, p.stderr
    assert f"written by a newer sacbot (9.0.0, checkpoint format version {ck.FORMAT_VERSION + 1})" in p.stderr
    assert "Upgrade sacbot" in p.stderr and f"Nothing in {str(w)!r} was changed" in p.stderr
    assert dir_digests(w) == before
    p = sacbot(tmp_path, "inspect", w / ck.LATEST, timeout=60)
    assert p.returncode == 1 and p.stdout.startswith("cannot verify:") and "newer sacbot" in p.stdout
    assert isinstance(e.value, ck.CheckpointTooNew)


SYSTEM_ERRORS = {
    "EACCES": (OSError(errno.EACCES, os.strerror(errno.EACCES)), "give this user read access"),
    "EIO": (OSError(errno.EIO, os.strerror(errno.EIO)), "the disk reported an I/O error"),
    "EMFILE": (OSError(errno.EMFILE, os.strerror(errno.EMFILE)), r"raise the limit \(ulimit -n\)"),
    "ENOMEM": (OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)), "out of memory"),
    "MemoryError": (MemoryError(), "out of memory"),
}


@pytest.mark.parametrize("case", sorted(SYSTEM_ERRORS))
def test_a_file_the_system_will_not_read_stops_loading_and_moves_nothing(two_saves, monkeypatch, case):
    """EACCES was renamed *.corrupt-* and the bot started from an older file (or from scratch);
    EIO, EMFILE and ENOMEM took the same path."""
    error, advice = SYSTEM_ERRORS[case]
    latest = str(two_saves / ck.LATEST)
    real = zipfile.ZipFile

    def refusing(path, *a, **kw):
        if os.fspath(path) == latest:
            raise error
        return real(path, *a, **kw)

    monkeypatch.setattr(ck.zipfile, "ZipFile", refusing)
    before = dir_digests(two_saves)
    with pytest.raises(ck.CheckpointError, match=rf"{ck.LATEST}: .*{advice}") as e:
        ck.load_latest(str(two_saves), SPACES)
    assert dir_digests(two_saves) == before
    assert isinstance(e.value, ck.CheckpointUnreadable)
    with pytest.raises(ck.CheckpointUnreadable, match=advice):
        ck.read_checkpoint(latest)


def test_a_bot_whose_checkpoint_may_not_be_read_does_not_start_and_says_why(tmp_path, monkeypatch):
    cfg = small_cfg(tmp_path, pace="lockstep")
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 20)
    w = tmp_path / "w"
    latest, real = str(w / ck.LATEST), zipfile.ZipFile

    def refusing(path, *a, **kw):
        if os.fspath(path) == latest:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), latest)
        return real(path, *a, **kw)

    monkeypatch.setattr(ck.zipfile, "ZipFile", refusing)
    before = dir_digests(w)
    with pytest.raises(AgentError, match=r"cannot be read \(Permission denied\); give this user read access.*"
                                         rf"Nothing in {str(w)!r} was changed"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert dir_digests(w) == before


def test_a_directory_in_place_of_the_latest_is_not_moved_aside(two_saves):
    """EISDIR: not bytes proven bad, so not renamed; loading stops and names it."""
    os.replace(two_saves / ck.LATEST, two_saves / "kept.zip")
    os.mkdir(two_saves / ck.LATEST)
    before = sorted(os.listdir(two_saves))
    with pytest.raises(ck.CheckpointError, match="is a directory, not a regular file.*move it out of the way") as e:
        ck.load_latest(str(two_saves))
    assert sorted(os.listdir(two_saves)) == before and os.path.isdir(two_saves / ck.LATEST)
    assert isinstance(e.value, ck.CheckpointUnreadable)


def test_a_latest_that_vanishes_while_read_stops_loading_instead_of_a_traceback(two_saves, monkeypatch):
    """ENOENT between the listing and the read: the set-aside then failed with FileNotFoundError."""
    latest, real = str(two_saves / ck.LATEST), zipfile.ZipFile

    def vanishing(path, *a, **kw):
        if os.fspath(path) == latest and os.path.exists(latest):
            os.replace(latest, str(two_saves / "moved.zip"))  # someone else moves it away
        return real(path, *a, **kw)

    monkeypatch.setattr(ck.zipfile, "ZipFile", vanishing)
    with pytest.raises(ck.CheckpointError, match="moved or deleted while it was being read; start again") as e:
        ck.load_latest(str(two_saves))
    assert not [f for f in os.listdir(two_saves) if ".corrupt-" in f]
    assert isinstance(e.value, ck.CheckpointUnreadable)


def test_a_corrupt_file_that_cannot_be_moved_aside_stops_loading(two_saves, monkeypatch):
    (two_saves / ck.LATEST).write_bytes(b"torn")

    def refused(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(ck_load, "set_aside", refused)
    with pytest.raises(ck.CheckpointError, match="not a zip file.*could not be moved aside.*read access") as e:
        ck.load_latest(str(two_saves))
    assert isinstance(e.value, ck.CheckpointUnreadable)


# --- everything read from a checkpoint is validated -------------------------------------------
OTHER_RNG = json.dumps(np.random.Generator(np.random.PCG64DXSM(0)).bit_generator.state)  # same shape, other generator


@pytest.mark.timeout(300)
@pytest.mark.parametrize("change,said", [
    ({"acting_rng": 12345}, "acting_rng = 12345, expected the JSON text of a numpy generator state"),
    ({"acting_rng": OTHER_RNG}, "expected a PCG64 state"),
    ({"utd_carry": math.nan}, "utd_carry = nan, expected a finite number >= 0"),
])
def test_a_training_state_a_resume_cannot_use_is_invalid_and_set_aside(tmp_path, change, said, caplog):
    """With correct digests these passed `sacbot inspect` as valid, and every resume failed (a
    traceback); NaN was written back by the final save, so the bot crash-looped."""
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=10)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 40)
    w = tmp_path / "w"
    step = ck.read_checkpoint(str(w / ck.LATEST))["manifest"]["step"]
    assert "acting_rng" in meta_of(w / ck.LATEST) and os.path.exists(w / f"sac_step_{step}.zip")
    edit_meta(w / ck.LATEST, **change)
    p = sacbot(tmp_path, "inspect", w / ck.LATEST, timeout=60)
    assert p.returncode == 1 and p.stdout.startswith("invalid:") and said in p.stdout, p.stdout
    caplog.set_level(logging.INFO, logger="sacbot")
    again = Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert again.loaded_from == str(w / f"sac_step_{step}.zip")  # the step copy of the same save
    assert any(said in m and "kept aside as sac_latest.zip.corrupt-" in m for m in caplog.messages), caplog.messages
    play(again, 20)
    st = again.close()
    assert st["final_save"]["ok"]
    meta = meta_of(w / ck.LATEST)  # what was written back verifies
    assert math.isfinite(meta["utd_carry"]) and meta["env_steps"] == 60


def _set_replay(meta, **kw):
    meta["replay"].update(kw)


META_CASES = {
    "episodes negative": (lambda m: m.update(episodes=-1), "episodes = -1, expected an integer"),
    "passes a float": (lambda m: m.update(passes=1.5), "passes = 1.5"),
    "grad_steps a bool": (lambda m: m.update(grad_steps=True), "grad_steps = True"),
    "env_steps not the manifest's": (lambda m: m.update(env_steps=m["env_steps"] + 1), "but the manifest says"),
    "utd_carry negative": (lambda m: m.update(utd_carry=-0.5), "utd_carry = -0.5"),
    "utd_carry infinite": (lambda m: m.update(utd_carry=math.inf), "utd_carry = inf"),
    "rng_numpy not JSON": (lambda m: m.update(rng_numpy="{"), "rng_numpy is not JSON"),
    "rng_numpy of another generator": (lambda m: m.update(rng_numpy=OTHER_RNG), "expected a PCG64 state"),
    "learner missing": (lambda m: m.pop("learner"), "learner = None, expected a table"),
    "learner obs_dim not the spaces'": (lambda m: m["learner"].update(obs_dim=4), "learner.obs_dim = 4, but"),
    "learner updates negative": (lambda m: m["learner"].update(updates=-2), "learner.updates = -2"),
    "opponents not pairs": (lambda m: m.update(opponents=[{"0": "x"}]), "opponents holds"),
    "an opponent name too long": (lambda m: m.update(opponents=[[0, "x" * 300]]), "opponents holds"),
    "replay head past its capacity": (lambda m: _set_replay(m, head=10**6), "do not fit a ring"),
    "replay source row out of range": (lambda m: _set_replay(m, sources=[[0, 1, 10**6]]), "replay sources holds"),
    "replay chunk_gens of another length": (lambda m: _set_replay(m, chunk_gens=[1, 2, 3]), "chunk_gens lists 3"),
    "replay sources a dict": (lambda m: _set_replay(m, sources={"0": 1}), "replay sources = "),
}


@pytest.mark.parametrize("case", sorted(META_CASES))
def test_each_impossible_training_value_is_proven_corrupt_and_never_written(two_saves, case):
    """Cases nobody listed: counters of the wrong type or sign, a replay meta whose indices leave the
    ring, a learner of other sizes than the manifest's; read, resume and write agree."""
    edit, said = META_CASES[case]
    latest = two_saves / ck.LATEST
    edit_entry(latest, "training.msgpack.zst", lambda obj: edit(obj["meta"]))
    with pytest.raises(ck.CheckpointError, match="training state: ") as e:
        ck.read_checkpoint(str(latest))
    assert said in str(e.value) and type(e.value) is ck.CheckpointError  # proven corrupt
    ck.read_checkpoint(str(latest), entries=("actor",))  # eval reads the actor alone: unaffected
    loaded, path = ck.load_latest(str(two_saves), SPACES)
    assert path.endswith("sac_step_20.zip") and [f for f in os.listdir(two_saves) if ".corrupt-" in f]
    if case == "env_steps not the manifest's":
        return  # a writer makes the manifest from the meta: it cannot write this one
    # A writer never writes what its readers refuse.
    payload = {"arrays": loaded["arrays"], "meta": loaded["meta"]}
    edit(payload["meta"])
    before = dir_digests(two_saves)
    with pytest.raises(ck.CheckpointError, match="refusing to save"):
        ck.write_checkpoint(str(two_saves), payload, spaces=SPACES)
    assert dir_digests(two_saves) == before


def test_replay_links_outside_the_stored_rows_are_proven_corrupt(two_saves):
    latest = two_saves / ck.LATEST

    def far(obj):
        obj["arrays"]["replay.prev"][0] = 10**6

    edit_entry(latest, "replay-000.msgpack.zst", far)
    with pytest.raises(ck.CheckpointError, match=r"replay.prev links to row 1000000, outside \[-1, 12\)"):
        ck.read_checkpoint(str(latest))
    ck.read_checkpoint(str(latest), entries=("training",))  # the meta alone is sound
