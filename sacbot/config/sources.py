"""Where settings come from: defaults < the env id's preset < TOML < SACBOT_* variables < flags.

    cfg = load_config(toml_path, os.environ, cli_values)   # ConfigError names the bad value and its source
    add_arguments(parser); cfg = from_args(parser.parse_args())
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from sacbot.config.settings import (
    ALIASES,
    ENV_PREFIX,
    NOT_SETTINGS,
    ORIGINAL_SAVE_INTERVAL,
    Config,
    ConfigError,
    _accepted,
    _check,
    env_name,
    flag_name,
    log,
)

_TRUE = {"1", "true", "yes", "on"}
# Not "": SACBOT_SAVE_REPLAY= (set, empty) read as off and dropped the replay from every save,
# while an empty number was an error.  Empty is refused for numbers and yes/no settings alike (the
# original's SACLSTM_* aliases excepted: see _env_layer).
_FALSE = {"0", "false", "no", "off"}


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise ValueError
    return int(raw.strip()) if isinstance(raw, str) else int(raw)


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).strip().lower()
    if s in _TRUE | _FALSE:
        return s in _TRUE
    raise ValueError


def _to_float(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError
    return float(raw)


def _to_str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError
    return raw


_COERCE = {"bool": _to_bool, "int": _to_int, "float": _to_float, "str": _to_str}


def _looks_like_float(raw: Any) -> bool:
    try:
        float(raw)
        return isinstance(raw, str)
    except (TypeError, ValueError):
        return False


def coerce(f: dataclasses.Field, raw: Any, source: str) -> Any:
    """Turn a raw value (string from env/flags, or a TOML value) into the field's type and
    check its range; errors name ``source`` (the flag, env var or TOML key) and the field."""
    try:
        value = _COERCE.get(str(f.type), _to_str)(raw)
    except (TypeError, ValueError, OverflowError):
        hint = ""
        if str(f.type) == "int" and _looks_like_float(raw):
            hint = f" written out in digits ({raw!r} reads as a fraction or an exponent)"
        raise ConfigError(f"{source} = {raw!r} is not accepted: expected {_accepted(f)}{hint}") from None
    try:
        _check(f, value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return value


# --- sources ----------------------------------------------------------------------------
# Each source gives {field name: (raw value, where it came from)}; load_config layers them.
Layer = dict[str, tuple[Any, str]]


def _read_toml(path: str) -> dict:
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory: expected a TOML file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path!r} is not UTF-8 text ({e}): TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e.strerror or e}") from None


def _toml_layer(path: str | None, by_name: Mapping[str, dataclasses.Field]) -> Layer:
    """Keys at the top level, or all in one [sacbot] table; never both, so none is ignored."""
    if not path:
        return {}
    doc = _read_toml(path)
    prefix = ""
    if "sacbot" in doc:
        table = doc["sacbot"]
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: sacbot = {table!r} is not accepted: expected a [sacbot] table "
                              "of settings (or the settings as top-level keys)")
        others = sorted(k for k in doc if k != "sacbot")
        if others:
            raise ConfigError(f"{path}: top-level keys {', '.join(others)} beside the [sacbot] table would be "
                              "ignored: move them into [sacbot], or drop the table and keep all keys top-level")
        doc, prefix = table, "sacbot."
    for key, raw in doc.items():
        if isinstance(raw, dict):  # e.g. [sacbot.wire.boundary]: the --help groups read like sections
            raise ConfigError(f"{path}: [{prefix}{key}] is a table, but sacbot's settings are flat keys, all "
                              f"top-level or all in one [sacbot] table (the groups in --help are not "
                              f"sections); move {', '.join(map(repr, raw)) or 'its keys'} up a level")
        if key not in by_name:
            raise ConfigError(f"{path}: unknown key {key!r}; known keys: " + ", ".join(sorted(by_name)))
        # TOML values carry their type: a quoted number or a "yes" is a mistake here, though the same
        # text is how env vars and flags arrive.
        typ = str(by_name[key].type)
        if (typ == "bool" and not isinstance(raw, bool)) or (typ in ("int", "float") and isinstance(raw, str)):
            want = "true or false (a TOML boolean)" if typ == "bool" else \
                f"{_accepted(by_name[key])}, as a TOML number (no quotes)"
            raise ConfigError(f"{path}: {key} = {raw!r} is not accepted: expected {want}")
    return {key: (raw, f"{path}: {key}") for key, raw in doc.items()}


def _env_layer(env: Mapping[str, str], by_name: Mapping[str, dataclasses.Field], warn: bool = True) -> Layer:
    """``SACBOT_*`` names, and the original's ``SACLSTM_*`` aliases below them."""
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower()
               not in by_name and k not in NOT_SETTINGS]
    if unknown:
        raise ConfigError(f"unknown environment variable {unknown[0]}; known: "
                          + ", ".join(env_name(n) for n in by_name))
    layer: Layer = {}
    for alias, name in ALIASES.items():
        if alias not in env or not env[alias].strip():
            # The original's launch scripts may set an alias empty (SACLSTM_EVAL_MODE=) to mean off,
            # which it read so: as unset, the default, here too.
            continue
        if env_name(name) in env:
            if warn:
                log.warning("both %s=%r and %s=%r are set; using %s (SACBOT_* names win)", alias, env[alias],
                            env_name(name), env[env_name(name)], env_name(name))
            continue
        layer[name] = (env[alias], alias)
    for name in by_name:
        if env_name(name) in env:
            layer[name] = (env[env_name(name)], env_name(name))
    return layer


def _cli_layer(cli: Mapping[str, Any] | None, by_name: Mapping[str, dataclasses.Field]) -> Layer:
    return {name: (raw, flag_name(by_name[name])) for name, raw in (cli or {}).items() if raw is not None}


def resolve_env_id(env_id: str) -> str:
    """``env_id`` with its version when it names none and gymnasium would pick the latest
    (``sacbot/TankDuelRadar`` plays ``-v1``): the preset, the saved bot and the env must agree
    on which one runs.  Other ids are returned as given (gym.make judges them)."""
    if ":" in env_id or not env_id.strip():
        return env_id
    import gymnasium as gym
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    from sacbot import envs  # noqa: F401 - registers sacbot's ids

    try:
        ns, name, version = parse_env_id(env_id)
    except gym.error.Error:
        return env_id
    if version is not None or env_id in gym.registry:
        return env_id
    latest = find_highest_version(ns, name)
    if latest is None:
        return env_id
    full = f"{ns + '/' if ns else ''}{name}-v{latest}"
    log.info("%s names no version: it means %s, the latest (give the version to pin it)", env_id, full)
    return full


def _preset_layer(env_id: str, given: Mapping[str, Any]) -> Layer:
    """The preset of ``env_id`` (sacbot/config/presets.py), said once on the "sacbot" logger."""
    from sacbot.config.presets import preset_for

    found = preset_for(env_id)
    if found is None:
        log.info("no preset for %s: sacbot's defaults apply", env_id)
        return {}
    name, preset = found
    if "env" in preset:
        raise ConfigError(f"preset {name!r} sets env; a preset is chosen by the env and cannot change it")
    used = {k: v for k, v in preset.items() if k not in given}
    text = ", ".join(f"{k}={v}" for k, v in preset.items())
    over = [k for k in preset if k in given]
    log.info("preset for %s: %s (settings you give override it%s)", name, text,
             f"; overridden: {', '.join(over)}" if over else "")
    return {k: (v, f"preset {name}: {k}") for k, v in used.items()}


def load_config(toml_path: str | None = None, env: Mapping[str, str] | None = None,
                cli: Mapping[str, Any] | None = None) -> Config:
    """Merge defaults < preset of the env id < TOML < env < cli.  ``cli`` maps field names to
    raw values.  Every value given is checked, also one that a higher source overrides."""
    by_name = {f.name: f for f in fields(Config)}
    env = os.environ if env is None else env
    given: dict[str, Any] = {}
    aliased = False
    for layer in _user_layers(toml_path, env, cli, by_name):
        for name, (raw, source) in layer.items():
            given[name] = coerce(by_name[name], raw, source)
            aliased = aliased or source in ALIASES
    # The original's launch scripts set its SACLSTM_* variables or name the weights zip: they get its
    # contract, save interval included, unless a setting says otherwise.
    if aliased and "original" not in given:
        given["original"] = True
    zip_path = str(given.get("weights_path", Config.weights_path)).lower().endswith(".zip")
    if (given.get("original") or zip_path) and "save_interval" not in given:
        given["save_interval"] = ORIGINAL_SAVE_INTERVAL
    # The env id is resolved from every source first: its preset sits under all of them.
    if isinstance(given.get("env"), str):
        given["env"] = resolve_env_id(given["env"])
    preset = {}
    env_id = given.get("env", Config.env)
    if given.get("preset", True):
        layer = _preset_layer(env_id, given)
    else:
        layer = {}
        log.info("no preset applied for %s (preset = false): sacbot's defaults apply", env_id)
    for name, (raw, source) in layer.items():
        if name not in by_name:
            raise ConfigError(f"{source}: unknown setting; known: " + ", ".join(sorted(by_name)))
        preset[name] = coerce(by_name[name], raw, source)
    try:
        return Config(**{**preset, **given})
    except ConfigError as e:
        # A conflict between the preset and a setting the user gave: without naming the preset the
        # message would blame a value the user never set.
        if not _builds(given):  # the user's own settings conflict: the preset is not to blame
            raise
        culprits = {k: v for k, v in preset.items() if k not in given and not _builds({**given, k: v})}
        if not culprits:
            raise
        shown = ", ".join(f"{k} = {v!r}" for k, v in culprits.items())
        raise ConfigError(f"{e} ({shown} {'comes' if len(culprits) == 1 else 'come'} from the preset for "
                          f"{given.get('env', Config.env)}; a setting you give overrides it)") from None


def _user_layers(toml_path: str | None, env: Mapping[str, str], cli: Mapping[str, Any] | None,
                 by_name: Mapping[str, dataclasses.Field], warn: bool = True) -> tuple[Layer, Layer, Layer]:
    """What the user gave, lowest first: the TOML file, the variables, the flags."""
    return _toml_layer(toml_path, by_name), _env_layer(env, by_name, warn), _cli_layer(cli, by_name)


def _ns_sources(ns, env: Mapping[str, str] | None) -> tuple[str | None, Mapping[str, str], dict[str, Any]]:
    """(TOML path, variables, flags) of parsed arguments ``ns``."""
    env = os.environ if env is None else env
    cli = {f.name: getattr(ns, f.name, None) for f in fields(Config)}
    return getattr(ns, "config", None) or env.get("SACBOT_CONFIG"), env, cli


def _builds(values: dict) -> bool:
    try:
        Config(**values)
    except ConfigError:
        return False
    return True


def add_arguments(parser, groups: tuple[str, ...] = ("run", "learner", "runtime")) -> None:
    """Add one flag per config field (help text from the field's doc) to an argparse parser."""
    import argparse

    for g in groups:
        grp = parser.add_argument_group(g)
        for f in fields(Config):
            if f.metadata["group"] != g:
                continue
            alias = "".join(f" or {k}" for k, v in ALIASES.items() if v == f.name)
            help_ = f"{f.metadata['doc']} (env {env_name(f.name)}{alias}; default {f.default!r})"
            if str(f.type) == "bool" and flag_name(f).startswith("--no-"):
                # --no-fresh-start / --fresh-start: argparse's own negation would read
                # --no-no-fresh-start.
                pair = grp.add_mutually_exclusive_group()
                pair.add_argument(flag_name(f), dest=f.name, default=None, action="store_const",
                                  const=True, help=help_)
                pair.add_argument("--" + flag_name(f)[5:], dest=f.name, action="store_const", const=False,
                                  help=f"undo {flag_name(f)} set in a TOML file or {env_name(f.name)}")
            elif str(f.type) == "bool":  # --quiet / --no-quiet; None keeps lower sources
                grp.add_argument(flag_name(f), dest=f.name, default=None,
                                 action=argparse.BooleanOptionalAction, help=help_)
            else:
                grp.add_argument(flag_name(f), dest=f.name, default=None, metavar=f.name.upper(),
                                 help=help_)


def from_args(ns, env: Mapping[str, str] | None = None) -> Config:
    return load_config(*_ns_sources(ns, env))


def given_settings(ns, env: Mapping[str, str] | None = None, warn: bool = True) -> frozenset[str]:
    """The names of the settings the user gave (flags, ``SACBOT_*`` and the original's variables,
    the TOML file), as opposed to those left to a preset or the defaults: a command resuming a
    saved bot lets the rest of those that shape its networks follow the bot.  ``warn=False``:
    the variables' warnings are not said again (``from_args`` says them)."""
    toml_path, env, cli = _ns_sources(ns, env)
    layers = _user_layers(toml_path, env, cli, {f.name: f for f in fields(Config)}, warn)
    return frozenset(name for layer in layers for name in layer)


def env_given(ns, env: Mapping[str, str] | None = None) -> bool:
    """Whether the user named the env (a flag, ``SACBOT_ENV`` or the TOML file), as opposed to
    the default: a command may then take it from a saved bot instead."""
    env = os.environ if env is None else env
    if getattr(ns, "env", None) is not None or "SACBOT_ENV" in env:
        return True
    path = getattr(ns, "config", None) or env.get("SACBOT_CONFIG")
    if not path:
        return False
    doc = _read_toml(path)
    table = doc.get("sacbot") if isinstance(doc.get("sacbot"), dict) else doc
    return "env" in table
