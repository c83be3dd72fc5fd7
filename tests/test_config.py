"""Config: sources, ceilings, the original's aliases and
file layout, per-env presets."""

from __future__ import annotations

import logging
import os

import gymnasium as gym
import pytest

from sacbot.app.envcheck import check_env
from sacbot.config import MAX_SEED, Config, ConfigError, load_config
from sacbot.config.presets import PRESETS, preset_for

TANK = "sacbot/TankDuel-v0"


def toml(tmp_path, text: str | bytes) -> str:
    p = tmp_path / "bot.toml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return str(p)


# --- TOML -------------------------------------------------------------------------------
@pytest.mark.parametrize("text,match", [
    ("sacbot = 5\n", r"sacbot = 5 is not accepted: expected a \[sacbot\] table"),
    ("hidden = 32\nseq_len = 8\n[sacbot]\nbatch_size = 4\n", "top-level keys hidden, seq_len beside the"),
    (b"hidden = 32\n# \xff\xfe\n", "is not UTF-8"),
    ("hidden = 1e10\n", r"hidden = 10000000000 is not accepted: expected an integer in \[1, 1024\]"),
    ("hidden = 1.5\n", "hidden = 1.5 is not accepted"),
    ("env = 5\n", "env = 5 is not accepted: expected a string"),
    ("seed = [1]\n", r"seed = \[1\] is not accepted"),
    # quoted numbers and words for booleans are how env vars arrive, not how TOML writes them
    ('hidden = "8"\n', r"hidden = '8' is not accepted: expected an integer in \[1, 1024\], as a TOML number"),
    ('quiet = "yes"\n', r"quiet = 'yes' is not accepted: expected true or false \(a TOML boolean\)"),
    ("quiet = 1\n", "quiet = 1 is not accepted"),
    # the --help groups read like sections; "learner" is also a setting, which said "expected thread, process"
    ("[sacbot.learner]\nhidden = 32\n", r"\[sacbot.learner\] is a table, .* move 'hidden' up a level"),
    ("[learner]\nhidden = 32\n", r"\[learner\] is a table, .* not sections"),
])
def test_bad_toml_names_the_key_and_what_is_accepted(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(toml(tmp_path, text), {}, {})


def test_toml_in_a_sacbot_table_or_top_level(tmp_path):
    assert load_config(toml(tmp_path, "[sacbot]\nhidden = 32\n"), {}, {}).hidden == 32
    assert load_config(toml(tmp_path, "hidden = 48\n"), {}, {}).hidden == 48


def test_a_directory_as_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a directory: expected a TOML file"):
        load_config(str(tmp_path), {}, {})


# --- ceilings ---------------------------------------------------------------------------
@pytest.mark.parametrize("flag,raw,match", [
    ("seed", "18446744073709551615", r"--seed: seed = 18446744073709551615 .* \[0, 2\*\*63 - 1\]"),
    ("seed", "-1", "--seed: seed = -1 is not accepted"),
    ("hidden", "100000", r"--hidden: hidden = 100000 .* \[1, 1024\]"),
    ("buffer_size", "1e10", r"--buffer-size = '1e10' .* \[1, 10,000,000\] written out in digits"),
    ("buffer_size", "10000001", r"buffer_size = 10000001 is not accepted"),
    ("torch_threads", "100000", r"--torch-threads: torch_threads = 100000 .* \[1, 256\]"),
    ("batch_size", "99999", "batch_size = 99999 is not accepted"),
    ("init_alpha", "nan", "init_alpha = nan is not accepted"),
    # Above log 2 per dimension no squashed policy reaches the target: the temperature would grow forever.
    ("target_entropy_per_dim", "0.7", r"target_entropy_per_dim = 0.7 is not accepted: .*\[-10.0, 0.5\]"),
])
def test_values_past_a_ceiling_are_config_errors(flag, raw, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, {}, {flag: raw})


def test_the_ceilings_themselves_are_accepted():
    cfg = load_config(None, {}, {"seed": str(MAX_SEED), "torch_threads": "256", "buffer_size": "10000000"})
    assert (cfg.seed, cfg.torch_threads, cfg.buffer_size) == (MAX_SEED, 256, 10_000_000)


@pytest.mark.parametrize("kw", [dict(hidden=64.5), dict(hidden=True), dict(env=5), dict(quiet=1),
                                dict(weights_path=""), dict(weights_path="w/.zip"), dict(tensorboard=" ")])
def test_config_built_in_code_is_checked_too(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        Config(**kw)


# --- the original's variables -------------------------------------------------------------
def test_saclstm_aliases_are_read():
    cfg = load_config(None, {"SACLSTM_UTD_RATIO": "0.5", "SACLSTM_BATCH_SIZE": "8",
                             "SACLSTM_SAVE_INTERVAL": "50", "SACLSTM_EVAL_MODE": "1",
                             "SACLSTM_WEIGHTS_PATH": "/d/weights/sac_latest.zip",
                             "SACLSTM_SOMETHING_ELSE": "x"}, {})  # the old bot's other vars: ignored
    assert (cfg.utd_ratio, cfg.batch_size, cfg.save_interval, cfg.eval_mode) == (0.5, 8, 50, True)
    assert cfg.weights_path == "/d/weights/sac_latest.zip"


def test_sacbot_names_win_over_aliases_and_say_so(caplog):
    with caplog.at_level(logging.INFO, logger="sacbot"):
        cfg = load_config(None, {"SACLSTM_BATCH_SIZE": "8", "SACBOT_BATCH_SIZE": "12"}, {})
    assert cfg.batch_size == 12
    said = [r.getMessage() for r in caplog.records if "SACLSTM_BATCH_SIZE" in r.getMessage()]
    assert len(said) == 1 and "using SACBOT_BATCH_SIZE" in said[0], said


def test_flags_win_over_aliases_and_a_bad_alias_names_itself():
    assert load_config(None, {"SACLSTM_UTD_RATIO": "2"}, {"utd_ratio": "3"}).utd_ratio == 3.0
    with pytest.raises(ConfigError, match="SACLSTM_EVAL_MODE = 'maybe'"):
        load_config(None, {"SACLSTM_EVAL_MODE": "maybe"}, {})


def test_file_places_in_sacbots_layout():
    cfg = Config(weights_path="w", run_dir="r")
    assert not cfg.original_layout
    assert (cfg.weights_dir, cfg.latest_name) == ("w", "sac_latest.zip")
    assert os.path.join(cfg.weights_dir, cfg.latest_name) == os.path.join("w", "sac_latest.zip")
    assert cfg.round_counter_path == os.path.join("w", "round_counter.txt")
    assert cfg.metrics_path == os.path.join("r", "training_metrics.jsonl")


def test_file_places_in_the_originals_layout(tmp_path):
    cfg = Config(weights_path=str(tmp_path / "weights" / "bot.zip"), run_dir="r")
    assert cfg.original_layout
    assert (cfg.weights_dir, cfg.latest_name) == (str(tmp_path / "weights"), "bot.zip")
    # A zip named other than sac_latest.zip prefixes its own files, so two bots in one folder
    # never share a counter or a metrics log.
    assert cfg.round_counter_path == str(tmp_path / "weights" / "bot.round_counter.txt")
    assert cfg.metrics_path == str(tmp_path / "bot.training_metrics.jsonl")  # weights dir's parent
    orig = Config(weights_path=str(tmp_path / "weights" / "sac_latest.zip"), run_dir="r")
    assert orig.round_counter_path == str(tmp_path / "weights" / "round_counter.txt")
    assert orig.metrics_path == str(tmp_path / "training_metrics.jsonl")


def test_a_bare_zip_name_lives_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = Config(weights_path="sac_latest.zip")
    assert (cfg.weights_dir, cfg.latest_name) == (".", "sac_latest.zip")
    assert cfg.metrics_path == str(tmp_path.parent / "training_metrics.jsonl")


# --- presets ----------------------------------------------------------------------------
def test_the_default_env_gets_its_preset_and_says_so(caplog):
    assert preset_for(TANK) is not None and Config.init_alpha == 1.0
    with caplog.at_level(logging.INFO, logger="sacbot"):
        cfg = load_config(None, {}, {})
    assert cfg.env == TANK and cfg.init_alpha == PRESETS[TANK]["init_alpha"]
    msgs = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith(f"preset for {TANK}: init_alpha=") for m in msgs) == 1, msgs


@pytest.mark.parametrize("source", ["toml", "env", "flag"])
def test_any_setting_given_overrides_the_preset(tmp_path, source, caplog):
    toml_path = toml(tmp_path, "init_alpha = 0.3\n") if source == "toml" else None
    env = {"SACBOT_INIT_ALPHA": "0.3"} if source == "env" else {}
    cli = {"init_alpha": "0.3"} if source == "flag" else {}
    with caplog.at_level(logging.INFO, logger="sacbot"):
        cfg = load_config(toml_path, env, cli)
    assert cfg.env == TANK and cfg.init_alpha == 0.3
    assert any("overridden: init_alpha" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("source", ["toml", "env", "flag"])
def test_the_env_id_from_any_source_chooses_the_preset(tmp_path, source):
    """Pendulum named anywhere, even below a flag that says nothing of the env: no TankDuel preset."""
    toml_path = toml(tmp_path, 'env = "Pendulum-v1"\n') if source == "toml" else None
    env = {"SACBOT_ENV": "Pendulum-v1"} if source == "env" else {}
    cli = {"env": "Pendulum-v1"} if source == "flag" else {}
    cfg = load_config(toml_path, env, {**cli, "hidden": "32"})
    assert cfg.env == "Pendulum-v1" and cfg.init_alpha == 1.0


@pytest.mark.parametrize("source", ["toml", "env", "flag"])
def test_preset_false_from_any_source_leaves_every_preset_value_at_its_default(tmp_path, source, caplog):
    toml_path = toml(tmp_path, "preset = false\n") if source == "toml" else None
    env = {"SACBOT_PRESET": "false"} if source == "env" else {}
    cli = {"preset": False} if source == "flag" else {}
    with caplog.at_level(logging.INFO, logger="sacbot"):
        cfg = load_config(toml_path, env, cli)
    assert cfg.env == TANK and not cfg.preset and PRESETS[TANK]
    assert {k: getattr(cfg, k) for k in PRESETS[TANK]} == {k: getattr(Config, k) for k in PRESETS[TANK]}
    msgs = [r.getMessage() for r in caplog.records]
    assert f"no preset applied for {TANK} (preset = false): sacbot's defaults apply" in msgs
    assert not any(m.startswith(f"preset for {TANK}") for m in msgs), msgs


def test_an_unknown_env_gets_the_defaults(caplog):
    assert preset_for("Pendulum-v1") is None
    with caplog.at_level(logging.INFO, logger="sacbot"):
        cfg = load_config(None, {}, {"env": "Pendulum-v1"})
    defaults = Config(env="Pendulum-v1")
    assert cfg == defaults and cfg.init_alpha == 1.0
    assert any("no preset for Pendulum-v1" in r.getMessage() for r in caplog.records)


def test_a_preset_with_a_bad_value_names_the_preset(monkeypatch):
    monkeypatch.setitem(PRESETS, "Pendulum-v1", {"hidden": 0})
    with pytest.raises(ConfigError, match="preset Pendulum-v1: hidden: hidden = 0"):
        load_config(None, {}, {"env": "Pendulum-v1"})


# --- the env check ----------------------------------------------------------------------
def test_a_step_checkpoint_as_weights_path_is_refused_for_training_but_read_by_eval():
    with pytest.raises(ConfigError, match="it names a step checkpoint"):
        Config(weights_path="w/sac_step_3.zip")
    assert Config(weights_path="w/sac_step_3.zip", eval_mode=True).latest_name == "sac_step_3.zip"


@pytest.mark.parametrize("text", ['{"a": ' + "[" * 20000 + "]" * 20000 + "}", '{"radar_arc": 1' + "0" * 5000 + "}"])
def test_env_kwargs_that_json_cannot_read_are_a_config_error(text):
    with pytest.raises(ConfigError, match="env_kwargs = .* is not accepted: expected a JSON object"):
        Config(env_kwargs=text)
    with pytest.raises(ConfigError, match="sacbot plays without rendering"):
        Config(env_kwargs='{"render_mode": "human"}')


def test_an_empty_env_var_is_refused_for_a_boolean_as_for_a_number():
    with pytest.raises(ConfigError, match="SACBOT_SAVE_REPLAY = '' is not accepted: expected a boolean"):
        load_config(None, {"SACBOT_SAVE_REPLAY": ""}, {})
    with pytest.raises(ConfigError, match="SACBOT_N_STEP = '' is not accepted"):
        load_config(None, {"SACBOT_N_STEP": ""}, {})
    assert load_config(None, {"SACBOT_SAVE_REPLAY": " Off "}, {}).save_replay is False


@pytest.mark.parametrize("path", ["w/best.zip", "w/pretrained/tankduel.zip", "w/pretrained/../pretrained/x.zip"])
def test_a_kept_bot_as_weights_path_is_refused_for_training_but_read_by_eval(path):
    """The runner's best.zip and the pretrained bots would be overwritten by every save."""
    with pytest.raises(ConfigError, match="names a bot sacbot keeps apart"):
        Config(weights_path=path)
    assert Config(weights_path=path, eval_mode=True).latest_name == os.path.basename(path)
    Config(weights_path="w/pretrained_old/sac_latest.zip")  # only those names


def test_check_env_turns_a_failing_first_step_into_a_config_error():
    check_env(Config(env="Pendulum-v1", env_kwargs='{"g": 9.81}'))
    with pytest.raises(ConfigError, match=r"env = 'Pendulum-v1' with env_kwargs = \{\"g\": \"abc\"\} "
                                          "fails at step: TypeError"):
        check_env(Config(env="Pendulum-v1", env_kwargs='{"g": "abc"}'))
    with pytest.raises(ConfigError, match="fails at make: .*Nope"):
        check_env(Config(env="Nope-v9"))
    # A kwarg that makes the env's values NaN passed, and the bot crashed after writing step 0.
    with pytest.raises(ConfigError, match=r"gives values sacbot cannot learn from at step: the observation after "
                                          r"one step has non-finite values"):
        check_env(Config(env="Pendulum-v1", env_kwargs='{"g": NaN}'))
    # An env sacbot cannot drive is the user's setting too (it exited 1 from inside the driver).
    with pytest.raises(ConfigError, match=r"env = 'CartPole-v1': action space Discrete\(2\) is not supported"):
        check_env(Config(env="CartPole-v1"))
    # ... but a Dict observation is flattened, as the driver does, so it passes.
    gym.register("sacbot-test/DictObs-v0", entry_point=lambda: gym.wrappers.TransformObservation(
        gym.make("Pendulum-v1"), lambda o: {"o": o}, gym.spaces.Dict({"o": gym.make("Pendulum-v1").observation_space})))
    check_env(Config(env="sacbot-test/DictObs-v0"))


def test_help_names_the_originals_alias_beside_sacbots_variable():
    import argparse

    from sacbot.config import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    text = " ".join(p.format_help().split())
    assert "env SACBOT_EVAL_MODE or SACLSTM_EVAL_MODE;" in text and "env SACBOT_HIDDEN;" in text


def test_a_no_flag_negates_to_its_plain_name_and_undoes_a_toml_setting(tmp_path):
    import argparse

    from sacbot.config import add_arguments, from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert "--no-no-" not in p.format_help()
    path = toml(tmp_path, "no_fresh_start = true\n")
    assert from_args(p.parse_args([]), {"SACBOT_CONFIG": path}).no_fresh_start
    assert not from_args(p.parse_args(["--fresh-start"]), {"SACBOT_CONFIG": path}).no_fresh_start
    assert from_args(p.parse_args([]), {"SACBOT_NO_FRESH_START": "1"}).no_fresh_start
    assert not from_args(p.parse_args(["--fresh-start"]), {"SACBOT_NO_FRESH_START": "1"}).no_fresh_start
    assert from_args(p.parse_args(["--no-fresh-start"]), {}).no_fresh_start
    assert from_args(p.parse_args(["--no-save-replay"]), {}).save_replay is False


# --- every setting has a range that can be trained --------------------------------------
@pytest.mark.parametrize("raw", ["1e307", "1e300", "257", "-1", "inf", "nan"])
def test_a_utd_ratio_past_what_a_pass_can_take_is_refused_naming_the_range(raw):
    # 1e307 ended in an OverflowError traceback; 1e300 trained, and saved a carry no resume could shed.
    with pytest.raises(ConfigError, match=r"--utd-ratio: utd_ratio = .* is not accepted: expected a number in "
                                          r"\[0.0, 256\]"):
        load_config(None, {}, {"utd_ratio": raw})
    assert load_config(None, {}, {"utd_ratio": "256"}).utd_ratio == 256.0
    assert load_config(None, {}, {"utd_ratio": "0"}).utd_ratio == 0.0  # store without training


@pytest.mark.timeout(120)
def test_sacbot_run_with_a_huge_utd_ratio_exits_2_with_one_line_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "sacbot", "run", "--env", "Pendulum-v1", "--hidden", "8",
                        "--batch-size", "4", "--seq-len", "4", "--learning-starts", "16", "--pace", "lockstep",
                        "--steps", "40", "--quiet", "--utd-ratio", "1e307", "--run-dir", str(tmp_path / "r"),
                        "--weights-path", str(tmp_path / "w")], capture_output=True, text=True, timeout=100)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "utd_ratio = 1e+307 is not accepted" in r.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


def test_every_numeric_setting_has_a_ceiling_and_a_floor():
    """Not only utd_ratio: a number without a ceiling lets some typo through to the learner."""
    from dataclasses import fields

    beside = {"learning_starts": {"buffer_size": 10_000_000}}  # no more than the buffer holds
    for f in fields(Config):
        if str(f.type) in ("int", "float"):
            lo, hi = f.metadata["min"], f.metadata["max"]
            assert lo is not None and hi is not None, f"{f.name} has no {'floor' if lo is None else 'ceiling'}"
            Config(**{f.name: hi, **beside.get(f.name, {})})  # the ceiling itself is a setting that can be given
            with pytest.raises(ConfigError, match=f"{f.name} = .* is not accepted"):
                Config(**{f.name: hi * 2 if hi else 1})


@pytest.mark.parametrize("flag,raw", [
    ("lr", "10"),  # diverged within 7 gradient steps on Pendulum-v1
    ("init_alpha", "1e300"),  # the first critic loss was inf
    ("tps", "1e300"),
    ("steps", "1" + "0" * 30),
    ("save_interval", "1" + "0" * 30),
    ("hidden", "2048"),  # no checkpoint of such a learner fits sacbot's cap, whatever the other settings
])
def test_other_settings_past_what_trains_are_refused_too(flag, raw):
    with pytest.raises(ConfigError, match=f"{flag} = .* is not accepted: expected"):
        load_config(None, {}, {flag: raw})


def test_the_hidden_ceiling_trains_and_saves_with_the_default_replay():
    from sacbot.store import checkpoint as ck
    hidden = Config.__dataclass_fields__["hidden"].metadata["max"]
    assert ck.checkpoint_byte_cap(35, 2, hidden, Config.buffer_size, True) <= ck.MAX_CHECKPOINT_BYTES


def test_the_utd_ceiling_is_what_one_training_pass_takes():
    from sacbot.config import MAX_UTD_RATIO
    from sacbot.learning.training import MAX_PASS_STEPS

    assert MAX_UTD_RATIO == MAX_PASS_STEPS  # one lockstep step's updates fit one pass: nothing piles up


# --- a changed utd_ratio takes effect on resume ------------------------------------------
def _checkpoint_with_carry(tmp_path, carry: float, saved_ratio: float):
    """A real checkpoint (50 transitions in its replay) that still owes ``carry`` gradient steps,
    saved by a bot trained at ``saved_ratio``."""
    import numpy as np
    from helpers import ACT_SPACE, OBS_SPACE, small_cfg

    from sacbot.acting.spaces import learner_spaces
    from sacbot.learning.training import TrainingState, handle_message
    from sacbot.store import checkpoint as ck
    from sacbot.wire.messages import NewEpisode, Transition

    cfg = small_cfg(tmp_path)
    st = TrainingState.fresh(cfg, 3, 1)
    handle_message(st, NewEpisode("x"))
    for t in range(50):
        handle_message(st, Transition(np.full(3, t / 50, np.float32), np.zeros(1, np.float32), 0.1,
                                      np.full(3, (t + 1) / 50, np.float32), False, False))
    st.pending, st.utd_carry = 0, carry
    ck.write_checkpoint(cfg.weights_dir, st.payload(True), config={**cfg.to_dict(), "utd_ratio": saved_ratio},
                        spaces=learner_spaces(3, OBS_SPACE, ACT_SPACE))
    return cfg


@pytest.mark.timeout(120)
@pytest.mark.parametrize("carry,saved_ratio", [(1e300, 1e300), (200.0, 256.0)])
def test_a_resume_at_another_utd_ratio_trains_at_the_new_one_from_the_first_step(tmp_path, carry, saved_ratio):
    """At --utd-ratio 1e300 a checkpoint saved a huge carry; a resume at --utd-ratio 1 still ran 256
    gradient steps per env step, for good.  A carry owed at 256 steps per transition is one step's
    worth at ratio 1."""
    import dataclasses

    from helpers import ACT_SPACE, OBS_SPACE, play

    from sacbot import Agent
    from sacbot.store import checkpoint as ck

    cfg = dataclasses.replace(_checkpoint_with_carry(tmp_path, carry, saved_ratio), pace="lockstep", utd_ratio=1.0)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        before = agent.status()["learner_steps"]
        play(agent, 20)
        took = agent.status()["learner_steps"] - before
    assert 20 <= took <= 22, f"{took} gradient steps for 20 env steps at --utd-ratio 1"
    saved = ck.read_checkpoint(os.path.join(cfg.weights_dir, cfg.latest_name))
    assert saved["meta"]["utd_carry"] < 2.0


def test_the_resumed_carry_is_rescaled_to_the_current_ratio_and_bounded_by_one_pass():
    import math

    from sacbot.learning.training import MAX_PASS_STEPS, resumed_carry

    assert resumed_carry(5.5, 8.0, 8.0) == 5.5  # unchanged: a lockstep resume stays exact
    assert resumed_carry(6.0, 8.0, 2.0) == 1.5  # 0.75 transitions' worth, at the new ratio
    assert resumed_carry(6.0, 8.0, 0.0) == 0.0  # --utd-ratio 0 owes nothing
    assert resumed_carry(0.4, 0.0, 2.0) == 0.0  # nothing was owed at ratio 0
    bound = 1 + MAX_PASS_STEPS
    for carry, saved in ((1e300, None), (math.inf, 1.0), (5000.0, 1.0), (1e300, 1e-300)):
        assert resumed_carry(carry, saved, 1.0) < bound  # a backlog, or no ratio saved: one pass at most
    assert resumed_carry(math.nan, 1.0, 1.0) == 0.0 and resumed_carry(-3.0, None, 1.0) == 0.0


# --- combinations that cannot fit in memory -----------------------------------------------
def test_a_replay_that_cannot_fit_this_machine_is_refused_before_anything_is_allocated(tmp_path):
    """10M rows of a 100,000-value observation: 8 TB, without the checkpoint cap to catch it when the
    replay is not saved.  It failed in the learner's first allocation, or later, in the OOM killer."""
    import gymnasium as gym
    import numpy as np
    from helpers import ACT_SPACE, small_cfg

    from sacbot import Agent

    wide = gym.spaces.Box(-1, 1, (100_000,), np.float32)
    cfg = small_cfg(tmp_path, buffer_size=10_000_000, save_replay=False)
    with pytest.raises(ConfigError, match=r"the replay \(buffer_size = 10,000,000 rows of 800,030 bytes for a "
                                          r"100000-value observation\) needs 8.0 TB.*this machine has "
                                          r"\(buffer_size = [\d,]+ at most fits beside it\); lower --buffer-size"):
        Agent(cfg, wide, ACT_SPACE)
    assert not os.path.exists(cfg.weights_dir)  # refused before the weights directory was made


def test_a_gradient_step_that_cannot_fit_this_machine_is_refused(tmp_path):
    """batch 4096 x (1024 + 1024 + 1) steps x hidden 1024: at least 550 GB for one update's
    activations (~34 floats per step and unit measured; 16 counted).  It started, and would have
    died in its first gradient step."""
    from helpers import ACT_SPACE, OBS_SPACE, small_cfg

    from sacbot import Agent

    if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 500e9:
        pytest.skip("this machine has the memory for it")
    cfg = small_cfg(tmp_path, batch_size=4096, seq_len=1024, burn_in=1024, hidden=1024, learning_starts=4096,
                    save_replay=False)
    with pytest.raises(ConfigError, match=r"one gradient step \(batch_size = 4096 sequences of burn_in \+ seq_len "
                                          r"\+ 1 = 2049 steps, hidden = 1024\) needs at least 550.\d GB of memory.*"
                                          r"batch_size = \d+ at most fits"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert not os.path.exists(cfg.weights_dir)
