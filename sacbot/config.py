"""One typed config.  Its fields generate the CLI flags, ``SACBOT_*`` env vars and TOML keys.

Precedence, lowest to highest: defaults < TOML file < ``SACBOT_*`` env vars < flags.
A field ``utd_ratio`` is the TOML key ``utd_ratio``, the env var ``SACBOT_UTD_RATIO``
and the flag ``--utd-ratio``.  A bad value raises :class:`ConfigError`, which names
the setting, the value and what is accepted; the CLI turns it into exit code 2.

    cfg = load_config(toml_path="bot.toml", env=os.environ, cli={"utd_ratio": "2"})
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "SACBOT_"


class ConfigError(ValueError):
    """A setting has a bad value; the message says which, what was given and what is accepted."""


def _f(default, doc: str, *, choices: tuple | None = None, min: float | None = None,
       max: float | None = None, flag: str | None = None, group: str = "run"):
    return field(default=default, metadata={"doc": doc, "choices": choices, "min": min,
                                            "max": max, "flag": flag, "group": group})


@dataclass(frozen=True)
class Config:
    # --- environment and run -------------------------------------------------------
    env: str = _f("sacbot/TankDuel-v0", "Gymnasium env id to play (Box action space), e.g. Pendulum-v1.")
    env_kwargs: str = _f("", 'JSON object of keyword arguments for the env, e.g. '
                             '\'{"opponents": ["spinner", "walker"], "schedule": "cycle"}\'.')
    seed: int = _f(0, "Seed for the env, replay sampling, network init and action noise.", min=0)
    steps: int = _f(0, "Stop after this many env steps (0: no limit).", min=0)
    episodes: int = _f(0, "Stop after this many episodes (0: no limit).", min=0)
    episodes_per_opponent: int = _f(0, "Stop once every opponent of the env's schedule has had this many "
                                       "episodes (0: off); for evals of multi-opponent envs.", min=0)
    pace: str = _f("free", "free: as fast as possible; realtime: fixed tick clock at --tps; "
                           "lockstep: acting waits for the learner's owed updates "
                           "(deterministic, for sample-efficiency comparisons).",
                   choices=("free", "realtime", "lockstep"))
    tps: float = _f(30.0, "Ticks per second in realtime pace.", min=1e-3)
    eval_mode: bool = _f(False, "Eval mode: deterministic actions, nothing sent to the learner, "
                                "nothing saved.", flag="--eval")
    run_dir: str = _f("runs/default", "Directory for status.json, metrics and episode logs.")
    weights_path: str = _f("weights", "Directory for checkpoints and the round counter.")
    quiet: bool = _f(False, "No live progress line.")
    # --- learner -------------------------------------------------------------------
    hidden: int = _f(64, "LSTM hidden size of actor and critic.", min=1, group="learner")
    batch_size: int = _f(16, "Sequences per gradient step (B).", min=1, group="learner")
    seq_len: int = _f(32, "Steps per sampled sequence (L).", min=1, group="learner")
    burn_in: int = _f(0, "Steps before each sequence used only to warm the recurrent state.",
                      min=0, group="learner")
    utd_ratio: float = _f(1.0, "Gradient steps per transition received; may be fractional.",
                          min=0.0, group="learner")
    learning_starts: int = _f(1000, "Transitions in the buffer before the first gradient step.",
                              min=0, group="learner")
    buffer_size: int = _f(100_000, "Replay capacity in transitions.", min=1, group="learner")
    gamma: float = _f(0.99, "Discount factor.", min=0.0, max=1.0, group="learner")
    tau: float = _f(0.005, "Polyak rate of the target critic.", min=0.0, max=1.0, group="learner")
    lr: float = _f(3e-4, "Adam learning rate of actor, critic and temperature.", min=0.0,
                   group="learner")
    init_alpha: float = _f(0.02, "Initial entropy temperature (learned from there). 0.02 suits TankDuel, "
                                 "whose rewards are small next to the entropy bonus; dense-reward envs such "
                                 "as Pendulum-v1 explore better from 1.0 (SB3's default).", min=1e-8,
                           group="learner")
    memoryless: bool = _f(False, "Control experiment: reset the recurrent state (and previous action) "
                                 "every step, in acting and in training (batch_size * seq_len sequences of 1).",
                           group="learner")
    quant: str = _f("on", "Quantization-aware actor (on) or plain fp32 (off).",
                    choices=("on", "off"), group="learner")
    quant_bits: int = _f(8, "Bits of the quantized actor's weights and inputs.", min=3, max=8,
                         group="learner")
    calib_updates: int = _f(500, "Updates observed in fp32 before fake quantization starts.",
                            min=1, group="learner")
    device: str = _f("cpu", "Torch device of the learner (cpu, cuda, cuda:N).", group="learner")
    torch_threads: int = _f(1, "Torch intra-op threads of the learner.", min=1, group="learner")
    # --- runtime -------------------------------------------------------------------
    queue_size: int = _f(256, "Capacity of the acting-to-training queue.", min=1, group="runtime")
    opponent_policy: str = _f("clear", "Replay policy when the opponent changes.",
                              choices=("clear", "keep"), group="runtime")
    save_interval: int = _f(5000, "Offer a checkpoint every N gradient steps.", min=1,
                            group="runtime")
    keep_last: int = _f(5, "Step-named checkpoints kept besides sac_latest.zip.", min=0,
                        group="runtime")
    save_replay: bool = _f(True, "Store the replay buffer in checkpoints for exact resume.",
                           group="runtime")
    no_fresh_start: bool = _f(False, "Refuse to start when checkpoints exist but none loads.",
                              group="runtime")

    def __post_init__(self):
        for f in fields(self):
            _check(f, getattr(self, f.name))
        self.env_kwargs_dict()  # validates

    def env_kwargs_dict(self) -> dict:
        if not self.env_kwargs.strip():
            return {}
        try:
            d = json.loads(self.env_kwargs)
        except json.JSONDecodeError as e:
            raise ConfigError(f"env_kwargs = {self.env_kwargs!r} is not accepted: expected a JSON object ({e})") \
                from None
        if not isinstance(d, dict):
            raise ConfigError(f"env_kwargs = {self.env_kwargs!r} is not accepted: expected a JSON object")
        return d

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _accepted(f: dataclasses.Field) -> str:
    m = f.metadata
    if m.get("choices"):
        return "one of " + ", ".join(m["choices"])
    if f.type in ("bool", bool):
        return "a boolean (1/0, true/false, yes/no, on/off)"
    kind = {"int": "an integer", "float": "a number", "str": "a string"}.get(str(f.type), str(f.type))
    lo, hi = m.get("min"), m.get("max")
    if lo is not None and hi is not None:
        return f"{kind} in [{lo}, {hi}]"
    if lo is not None:
        return f"{kind} >= {lo}"
    return kind


def _check(f: dataclasses.Field, value: Any) -> None:
    m = f.metadata
    bad = False
    if m.get("choices") and value not in m["choices"]:
        bad = True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            bad = True
        if m.get("min") is not None and value < m["min"]:
            bad = True
        if m.get("max") is not None and value > m["max"]:
            bad = True
    if bad:
        raise ConfigError(f"{f.name} = {value!r} is not accepted: expected {_accepted(f)}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def coerce(f: dataclasses.Field, raw: Any, source: str) -> Any:
    """Turn a raw value (string from env/flags, or a TOML value) into the field's type."""
    typ = str(f.type)
    try:
        if typ == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError
        if typ == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(str(raw).strip()) if isinstance(raw, str) else int(raw)
        if typ == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if not isinstance(raw, str):
            raise ValueError
        return raw
    except (TypeError, ValueError):
        raise ConfigError(f"{source} = {raw!r} is not accepted: expected {_accepted(f)}") from None


def load_config(toml_path: str | None = None, env: Mapping[str, str] | None = None,
                cli: Mapping[str, Any] | None = None) -> Config:
    """Merge defaults < TOML < env < cli.  ``cli`` maps field names to raw values."""
    by_name = {f.name: f for f in fields(Config)}
    values: dict[str, Any] = {}
    if toml_path:
        try:
            with open(toml_path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {toml_path!r} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {toml_path!r} is not valid TOML: {e}") from None
        doc = doc.get("sacbot", doc)  # allow a [sacbot] table or top-level keys
        for key, raw in doc.items():
            if key not in by_name:
                raise ConfigError(f"{toml_path}: unknown key {key!r}; known keys: "
                                  + ", ".join(sorted(by_name)))
            values[key] = coerce(by_name[key], raw, f"{toml_path}: {key}")
    env = os.environ if env is None else env
    for name, f in by_name.items():
        if env_name(name) in env:
            values[name] = coerce(f, env[env_name(name)], env_name(name))
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower()
               not in by_name and k != "SACBOT_CONFIG"]
    if unknown:
        raise ConfigError(f"unknown environment variable {unknown[0]}; known: "
                          + ", ".join(env_name(n) for n in by_name))
    for name, raw in (cli or {}).items():
        if raw is not None:
            values[name] = coerce(by_name[name], raw, flag_name(by_name[name]))
    return Config(**values)


def add_arguments(parser, groups: tuple[str, ...] = ("run", "learner", "runtime")) -> None:
    """Add one flag per config field (help text from the field's doc) to an argparse parser."""
    import argparse

    for g in groups:
        grp = parser.add_argument_group(g)
        for f in fields(Config):
            if f.metadata["group"] != g:
                continue
            help_ = f"{f.metadata['doc']} (env {env_name(f.name)}; default {f.default!r})"
            if str(f.type) == "bool":  # --quiet / --no-quiet; None keeps lower sources
                grp.add_argument(flag_name(f), dest=f.name, default=None,
                                 action=argparse.BooleanOptionalAction, help=help_)
            else:
                grp.add_argument(flag_name(f), dest=f.name, default=None, metavar=f.name.upper(),
                                 help=help_)


def from_args(ns, env: Mapping[str, str] | None = None) -> Config:
    cli = {f.name: getattr(ns, f.name, None) for f in fields(Config)}
    env = os.environ if env is None else env
    toml_path = getattr(ns, "config", None) or env.get("SACBOT_CONFIG")
    return load_config(toml_path, env, cli)
