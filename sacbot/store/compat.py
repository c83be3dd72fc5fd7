"""Whether a saved bot may resume under the settings and game given.

Part of :mod:`sacbot.store.checkpoint`, which documents the format and re-exports its names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection

from sacbot.config import Config, ConfigError
from sacbot.store.errors import CheckpointMismatch

RESUME_FIELDS = {
    "hidden": "the LSTM and layer shapes",
    "quant": "the actor's layers (quantization-aware or fp32)",
    "quant_bits": "the integer grid the actor's scales were learned for",
    "memoryless": "whether the actor and critic were trained with a recurrent state at all",
    "critic_memory": "whether the critic read the history or each step alone",
    "critic_layer_norm": "the critic's heads' layers (layer norm has parameters of its own)",
    "critic_head_layers": "how many hidden layers the critic's Q heads have",
    "critic_head_width": "the width of the critic's Q heads' layers",
    "reward_input": "the networks' inputs (the previous reward is one of them)",
    "reward_input_squash": "how the previous reward is scaled as the networks' input",
    "critic_obs": "which observation values the actor reads (the rest are the critic's alone)",
}


# A saved config without these fields was trained with this value (the field came later).
ABSENT_MEANS = {"reward_input": False, "reward_input_squash": "off", "critic_obs": 0, "critic_memory": True,
               "critic_layer_norm": False, "critic_head_layers": 1, "critic_head_width": 128}


def saved_settings(saved_cfg: dict) -> dict:
    """The value of each field of ``RESUME_FIELDS`` a saved config was trained with: its own, or
    for a field it lacks what ``ABSENT_MEANS`` says the absence meant (fields with neither are
    left out)."""
    return {k: saved_cfg[k] if k in saved_cfg else ABSENT_MEANS[k]
            for k in RESUME_FIELDS if k in saved_cfg or k in ABSENT_MEANS}


# What eval checks of a saved bot: its export carries its own sizes, so only the inputs and whether it
# carries a recurrent state decide how it plays.
ACTING_FIELDS = ("memoryless", "reward_input", "reward_input_squash", "critic_obs")


def follow_saved(cfg: Config, saved_cfg: dict, given: Collection[str], path: str) -> tuple[Config, dict]:
    """``cfg`` resuming the bot whose saved config is ``saved_cfg`` (read from ``path``): each
    setting that shapes its networks (``RESUME_FIELDS``; in eval, ``ACTING_FIELDS``) and that the
    user did not give (``given``: names set by flags, SACBOT_* variables or the TOML file) takes
    the value the bot was trained with, so a default or a preset that changed since does not
    refuse the bot.  A setting the user gave stays, and ``check_shapes`` refuses the resume if it
    differs.  Returns the config and the settings changed ({} when none)."""
    follow = ACTING_FIELDS if cfg.eval_mode else RESUME_FIELDS
    changed = {k: v for k, v in saved_settings(saved_cfg).items()
               if k in follow and k not in given and getattr(cfg, k, v) != v}
    if not changed:
        return cfg, {}
    try:
        return dataclasses.replace(cfg, **changed), changed
    except (ConfigError, TypeError) as e:
        shown = ", ".join(f"{k} = {v!r}" for k, v in changed.items())
        raise ConfigError(f"{path} holds a bot trained with {shown}, which this sacbot cannot take on: {e}; a new "
                          "bot needs a weights directory of its own (sacbot serve: another bot name or --root)") \
            from None


def config_differences(saved_cfg: dict, cfg: dict) -> list[tuple[str, object, object]]:
    """(field, saved value, value now) for each field of ``RESUME_FIELDS`` that differs.  Fields
    absent from either side are not compared (older checkpoints lack newer fields) unless
    ``ABSENT_MEANS`` says what their absence meant, nor are the bits of a saved fp32 actor, which
    has no integer grid, nor the critic's memory between two memoryless controls, which have none."""
    out = []
    saved_cfg = {**{k: v for k, v in ABSENT_MEANS.items() if k in cfg}, **saved_cfg}
    for key in RESUME_FIELDS:
        if key not in saved_cfg or key not in cfg:
            continue
        if key == "quant_bits" and saved_cfg.get("quant", "on") != "on":
            continue
        if key == "critic_memory" and saved_cfg.get("memoryless") and cfg.get("memoryless"):
            continue  # the control's critic reads each step alone either way
        if saved_cfg[key] != cfg[key]:
            out.append((key, saved_cfg[key], cfg[key]))
    return out


def check_shapes(ckpt: dict, expect: dict, path: str) -> None:
    """Raise CheckpointMismatch when the checkpoint's bot does not fit ``expect``: obs_dim and
    act_dim (from the env), and every field of ``RESUME_FIELDS`` that ``expect`` holds (it may
    hold a whole ``Config.to_dict()``; other fields are ignored).  The message names each
    field with both values."""
    spaces = ckpt["manifest"].get("spaces", {})
    cfg = ckpt["manifest"].get("config", {})
    # Settings first: a changed reward_input also changes obs_dim, and the setting is the cause.
    diffs = config_differences(cfg if isinstance(cfg, dict) else {}, expect)
    if diffs:
        raise CheckpointMismatch("; ".join(f"{path} holds a bot with {k} = {saved!r}, this run asks for "
                                           f"{k} = {now!r} ({RESUME_FIELDS[k]} differ)"
                                           for k, saved, now in diffs))
    cfg = cfg if isinstance(cfg, dict) else {}
    game = game_difference(cfg, spaces, expect)
    for key in ("obs_dim", "act_dim"):
        if key in expect and spaces.get(key) != expect[key]:
            what = "the networks' input (the env's obs_dim, + 1 with reward_input)" if key == "obs_dim" else "the env"
            envs = f" (its bot played {game})" if game else ""  # the game is the cause: name it
            raise CheckpointMismatch(f"{path}: {key} is {spaces.get(key)}, {what} needs {expect[key]}{envs}")
    if game and not expect.get("transfer"):
        raise CheckpointMismatch(f"{path} holds a bot that played {game}: its observations and actions would be "
                                 "read as this game's (pass --transfer if that is meant)")


def _same_env(saved: str, now: str) -> bool:
    """The same id, or a saved id without a version that names ``now``'s env (a run given
    ``Pendulum`` saved that, before sacbot resolved it to the ``Pendulum-v1`` gymnasium played)."""
    return saved == now or (re.search(r"-v\d+$", saved) is None and re.fullmatch(re.escape(saved) + r"-v\d+", now)
                            is not None)


def layout_differences(saved: dict | None, now: dict | None) -> list[str]:
    """The layout keys (sacbot.acting.games.env_layout) whose values differ, sorted; only keys both
    sides state count, so a key an env declares later does not refuse the bots saved before it."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []
    return sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])


def game_difference(saved_cfg: dict, spaces: dict, expect: dict) -> str | None:
    """How the game a checkpoint's bot played differs from the one ``expect`` describes, or None:
    another env id, or a value of the kwargs the env declares change what its values mean
    (``env_layout``, saved in the manifest's spaces; for a checkpoint from before that field,
    ``expect["layout_of"](saved config)`` derives it; ``layout_differences`` compares them)."""
    saved, now = saved_cfg.get("env"), expect.get("env")
    if isinstance(saved, str) and isinstance(now, str) and not _same_env(saved, now):
        return f"{saved}, this run plays {now}"
    now_l = expect.get("env_layout")
    if not isinstance(now_l, dict):
        return None
    saved_l = spaces.get("env_layout")
    if saved_l is None and callable(expect.get("layout_of")):
        saved_l = expect["layout_of"](saved_cfg)
    keys = layout_differences(saved_l, now_l)
    if not keys:
        return None
    return (f"{now} with " + ", ".join(f"{k}={saved_l[k]!r}" for k in keys)
            + ", this run has " + ", ".join(f"{k}={now_l[k]!r}" for k in keys))
