"""The preset table: one entry per env id, each a valid setting of a registered env.

How load_config applies presets (precedence, what overrides them, the log line) is tested in
tests/test_config.py; here, what the table holds."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest

import sacbot.envs  # noqa: F401 - registers the sacbot/* ids
from sacbot.config import Config, ConfigError, load_config
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


def test_the_tank_duels_keep_their_low_temperature_and_dense_rewards_get_the_default():
    # TankDuel's ~1.6 per hit is small next to an entropy bonus at alpha 1 (docs/experiments.md).
    for env_id in ("sacbot/TankDuel-v0", "sacbot/TankDuelRadar-v0", "sacbot/TankDuelRadar-v1",
                   "sacbot/TankDuelMemory-v0"):
        assert preset_for(env_id)[1]["init_alpha"] == 0.02
    # The 40-degree duel keeps v1's settings, which its pilot used (docs/experiments.md).
    assert PRESETS["sacbot/TankDuelMemory-v0"] == PRESETS["sacbot/TankDuelRadar-v1"]
    assert Config.init_alpha == 1.0
    for env_id in ("Pendulum-v1", "MountainCarContinuous-v0", "sacbot/CueMemory-v0"):
        assert preset_for(env_id) is None
        assert load_config(None, {}, {"env": env_id}).init_alpha == 1.0


def test_the_tank_duel_gets_n_step_returns_and_a_flag_or_env_var_takes_them_back():
    # A hit's reward lands 20-40 ticks after the shot (docs/experiments.md).
    assert load_config(None, {}, {"env": "sacbot/TankDuel-v0"}).n_step == 5
    assert load_config(None, {}, {"env": "sacbot/TankDuel-v0", "n_step": "1"}).n_step == 1
    assert load_config(None, {"SACBOT_N_STEP": "3"}, {}).n_step == 3  # the default env is TankDuel
    assert Config.n_step == 1 and load_config(None, {}, {"env": "Pendulum-v1"}).n_step == 1


def test_the_tank_duel_gets_burn_in_and_a_flag_or_env_var_takes_it_back():
    # Sequences start from a warmed LSTM state: seed 4's early dips (docs/experiments.md).
    assert load_config(None, {}, {"env": "sacbot/TankDuel-v0"}).burn_in == 8
    assert load_config(None, {}, {"env": "sacbot/TankDuel-v0", "burn_in": "0"}).burn_in == 0
    assert load_config(None, {"SACBOT_BURN_IN": "4"}, {}).burn_in == 4  # the default env is TankDuel
    assert Config.burn_in == 0 and load_config(None, {}, {"env": "Pendulum-v1"}).burn_in == 0
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v0"}).burn_in == 0  # not measured there
    v1 = load_config(None, {}, {"env": "sacbot/TankDuelRadar-v1"})  # its runs used TankDuel-v0's settings
    assert (v1.burn_in, v1.n_step) == (8, 5)  # (its critic_obs comes from the env: tests/test_cli.py)


def test_the_radar_duel_v1_gets_a_critic_without_memory_and_a_flag_gives_it_back():
    # Its critic-only values hold the enemy's state (docs/experiments.md).
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v1"}).critic_memory is False
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v1", "critic_memory": True}).critic_memory is True
    assert load_config(None, {"SACBOT_CRITIC_MEMORY": "1"}, {"env": "sacbot/TankDuelRadar-v1"}).critic_memory is True
    for env_id in ("sacbot/TankDuel-v0", "sacbot/TankDuelRadar-v0", "sacbot/Pendulum-P-v0", "Pendulum-v1"):
        assert load_config(None, {}, {"env": env_id}).critic_memory is True  # partial observations: it needs one


def test_the_radar_duel_v1_explores_more_and_every_other_env_keeps_sacs_target():
    # -0.5 per dimension found the first kills against tracker on seeds 0-4 (docs/experiments.md).
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v1"}).target_entropy_per_dim == -0.5
    assert load_config(None, {}, {"env": "sacbot/TankDuelRadar-v1",
                                  "target_entropy_per_dim": "-1"}).target_entropy_per_dim == -1.0
    assert load_config(None, {"SACBOT_TARGET_ENTROPY_PER_DIM": "-0.25"},
                       {"env": "sacbot/TankDuelRadar-v1"}).target_entropy_per_dim == -0.25
    for env_id in ("sacbot/TankDuel-v0", "sacbot/TankDuelRadar-v0", "sacbot/Pendulum-V-v0", "Pendulum-v1"):
        assert load_config(None, {}, {"env": env_id}).target_entropy_per_dim == Config.target_entropy_per_dim == -1.0


def test_preset_for_hands_out_a_copy():
    name, values = preset_for("sacbot/TankDuel-v0")
    values["init_alpha"] = 0.5
    assert name == "sacbot/TankDuel-v0" and PRESETS[name]["init_alpha"] == 0.02


def test_a_flag_overrides_a_preset_value():
    cfg = load_config(None, {}, {"env": "sacbot/TankDuelRadar-v0", "init_alpha": "0.1"})
    assert cfg.init_alpha == 0.1


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
    # Pendulum-P's preset turns reward_input on; critic_obs given by the user conflicts with it.
    with pytest.raises(ConfigError, match=r"reward_input = True comes from the preset for sacbot/Pendulum-P-v0"):
        load_config(None, {}, {"env": "sacbot/Pendulum-P-v0", "critic_obs": "2"})
    # The user's own conflict is reported as it was, with no preset named.
    with pytest.raises(ConfigError, match=r"turn one off$"):
        load_config(None, {}, {"env": "Pendulum-v1", "critic_obs": "2", "reward_input": "1"})
    # And overriding the preset's value resolves it, as the message says.
    fixed = load_config(None, {}, {"env": "sacbot/Pendulum-P-v0", "critic_obs": "2", "reward_input": "0"})
    assert (fixed.critic_obs, fixed.reward_input) == (2, False)
