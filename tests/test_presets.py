"""The preset table: one entry per env id, each a valid setting of a registered env.

How load_config applies presets (precedence, what overrides them, the log line) is tested in
tests/test_config.py; here, what the table holds."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import pytest

import sacbot.envs  # noqa: F401 - registers the sacbot/* ids
from sacbot.config import Config, ConfigError, env_name, load_config
from sacbot.config.presets import PRESETS, preset_for


@pytest.mark.parametrize("env_id", sorted(PRESETS))
def test_every_preset_names_a_registered_env_and_loads(env_id):
    assert env_id in gym.registry
    cfg = load_config(None, {}, {"env": env_id})
    for key, value in PRESETS[env_id].items():
        assert getattr(cfg, key) == value, key
    # Nothing else moves: the rest is the defaults.
    rest = {f.name for f in dataclasses.fields(Config)} - set(PRESETS[env_id]) - {"env"}
    assert all(getattr(cfg, k) == getattr(Config, k) for k in rest)


def _raw(value) -> str:
    """A value as a flag or an env var gives it."""
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


PRESET_KEYS = sorted((env_id, key) for env_id, values in PRESETS.items() for key in values)


@pytest.mark.parametrize("env_id, key", PRESET_KEYS)
def test_every_preset_value_is_taken_back_by_a_flag_an_env_var_or_a_toml_key(env_id, key, tmp_path):
    """Whatever a preset sets, the user's own value wins from every source (set here to the
    default, which a preset never repeats)."""
    default = getattr(Config, key)
    assert PRESETS[env_id][key] != default, f"{env_id}'s preset repeats the default of {key}"
    toml = tmp_path / "bot.toml"
    toml.write_text(f"{key} = {json.dumps(default)}\n")
    assert getattr(load_config(None, {}, {"env": env_id, key: _raw(default)}), key) == default
    assert getattr(load_config(None, {env_name(key): _raw(default)}, {"env": env_id}), key) == default
    assert getattr(load_config(str(toml), {}, {"env": env_id}), key) == default


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "sacbot/CueMemory-v0",
                                    "sacbot/Pendulum-P-v0", "sacbot/TankDuelRadar-v0"])
def test_an_env_without_a_preset_trains_at_the_defaults(env_id):
    assert preset_for(env_id) is None
    cfg = load_config(None, {}, {"env": env_id})
    assert all(getattr(cfg, f.name) == getattr(Config, f.name) for f in dataclasses.fields(Config) if f.name != "env")


def test_preset_for_hands_out_a_copy():
    name, values = preset_for("sacbot/TankDuel-v0")
    before = dict(PRESETS[name])
    values["init_alpha"] = before["init_alpha"] * 2
    assert name == "sacbot/TankDuel-v0" and PRESETS[name] == before


def test_an_id_without_a_version_gets_the_preset_of_the_version_gymnasium_plays():
    """gym.make("sacbot/TankDuelRadar") plays -v1; the preset lookup used the bare id and applied
    none, so the run trained v1 at the dense-reward defaults."""
    cfg = load_config(None, {}, {"env": "sacbot/TankDuelRadar"})
    assert cfg.env == "sacbot/TankDuelRadar-v1"
    assert (cfg.n_step, cfg.critic_memory) == (PRESETS["sacbot/TankDuelRadar-v1"]["n_step"], False)
    assert load_config(None, {}, {"env": "Pendulum"}).env == "Pendulum-v1"
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v0"}).env == "sacbot/TankDuelRadar-v0"  # pinned
    assert load_config(None, {}, {"env": "NoSuchGame"}).env == "NoSuchGame"  # gym.make judges it


def test_a_conflict_the_preset_causes_names_the_preset_and_the_value_it_set():
    # Pendulum-V's preset turns reward_input on; critic_obs given by the user conflicts with it.
    with pytest.raises(ConfigError, match=r"reward_input = True comes from the preset for sacbot/Pendulum-V-v0"):
        load_config(None, {}, {"env": "sacbot/Pendulum-V-v0", "critic_obs": "2"})
    # The user's own conflict is reported as it was, with no preset named.
    with pytest.raises(ConfigError, match=r"turn one off$"):
        load_config(None, {}, {"env": "Pendulum-v1", "critic_obs": "2", "reward_input": "1"})
    # And overriding the preset's value resolves it, as the message says.
    fixed = load_config(None, {}, {"env": "sacbot/Pendulum-V-v0", "critic_obs": "2", "reward_input": "0"})
    assert (fixed.critic_obs, fixed.reward_input) == (2, False)
