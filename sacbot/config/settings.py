"""One typed config.  Its fields generate the CLI flags, ``SACBOT_*`` env vars and TOML keys.

Precedence, lowest to highest: defaults < the preset of the env id (``sacbot/config/presets.py``)
< TOML file < ``SACBOT_*`` env vars < flags.  A field ``utd_ratio`` is the TOML key
``utd_ratio``, the env var ``SACBOT_UTD_RATIO`` and the flag ``--utd-ratio``.  The original
bot's ``SACLSTM_*`` names are read as aliases of five of them.  A bad value raises
:class:`ConfigError`, which names the setting, the value and what is accepted; the CLI
turns it into exit code 2.

    cfg = load_config(toml_path="bot.toml", env=os.environ, cli={"utd_ratio": "2"})
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "SACBOT_"
# The original bot's variables, read as aliases so its launch scripts keep working; a SACBOT_*
# name set too wins.
ALIASES = {"SACLSTM_UTD_RATIO": "utd_ratio", "SACLSTM_BATCH_SIZE": "batch_size",
           "SACLSTM_SAVE_INTERVAL": "save_interval", "SACLSTM_WEIGHTS_PATH": "weights_path",
           "SACLSTM_EVAL_MODE": "eval_mode"}
# numpy and torch both take seeds up to 2**64 - 1, and sacbot adds offsets to the seed
# (seed + 7919, seed + 1 + updates, seed + episode); 2**63 - 1 leaves them room.
MAX_SEED = 2**63 - 1
# Counts and intervals (steps, episodes, save_interval, ...): any size works as "never", but a
# count must stay an int64, as numpy, msgpack and the JSON readers of other languages hold it.
MAX_COUNT = 2**63 - 1
# The most gradient steps one env step may owe: one training pass takes at most this many
# (sacbot.learning.training.MAX_PASS_STEPS, kept equal by a test).  Above it each lockstep step would leave
# steps owed that pile up without bound, and a resume would carry the pile.
MAX_UTD_RATIO = 256
ORIGINAL_SAVE_INTERVAL = 500  # the original bot's default, kept under its contract
log = logging.getLogger("sacbot")
# SACBOT_* variables that are not settings: the TOML file's path, and sacbot serve's token (a secret,
# kept out of the Config that every checkpoint's manifest records).
NOT_SETTINGS = ("SACBOT_CONFIG", "SACBOT_SERVE_TOKEN")


class ConfigError(ValueError):
    """A setting has a bad value; the message says which, what was given and what is accepted."""


def _f(default, doc: str, *, choices: tuple | None = None, min: float | None = None,
       max: float | None = None, flag: str | None = None, group: str = "run"):
    return field(default=default, metadata={"doc": doc, "choices": choices, "min": min,
                                            "max": max, "flag": flag, "group": group})


@dataclass(frozen=True)
class Config:
    """Every setting of a bot, one field each.  The same field is a ``--flag`` (dashes for
    underscores), a ``SACBOT_<NAME>`` variable and a TOML key; ``load_config`` resolves them in
    that order over the env's preset and the defaults, and checks every value.

        cfg = load_config()                                   # flags, SACBOT_*, --config TOML, defaults
        cfg = Config(env="Pendulum-v1", hidden=32)            # in code: checked the same way
        agent = Agent(cfg, obs_space, action_space)

    Frozen: change a copy with ``dataclasses.replace(cfg, seed=3)``.  docs/reference.md lists
    every field with its flag, variable, default and range."""

    # --- environment and run -------------------------------------------------------
    env: str = _f("sacbot/TankDuel-v0", "Gymnasium env id to play (Box action space), e.g. Pendulum-v1; or "
                                        "module:EnvId (the module registers it) or module:ClassName (a "
                                        "gymnasium.Env subclass), the working directory importable.")
    preset: bool = _f(True, "Apply the env id's preset (a few settings tuned for that env, sacbot/config/presets.py) "
                            "under the settings you give. --no-preset: sacbot's defaults alone, as on a game with "
                            "no preset.")
    env_kwargs: str = _f("", 'JSON object of keyword arguments for the env, e.g. '
                             '\'{"opponents": ["spinner", "walker"], "schedule": "cycle"}\'.')
    seed: int = _f(0, "Seed for the env, replay sampling, network init and action noise; at most "
                      "2**63 - 1, which numpy and torch both take with the offsets sacbot adds.",
                   min=0, max=MAX_SEED)
    steps: int = _f(0, "Stop after this many env steps in this run; a resumed run counts from 0 (0: no limit).", min=0,
                    max=MAX_COUNT)
    episodes: int = _f(0, "Stop after this many episodes (0: no limit).", min=0, max=MAX_COUNT)
    episodes_per_opponent: int = _f(0, "Stop once every opponent of the env's schedule has had this many "
                                       "episodes (0: off); for evals of multi-opponent envs.", min=0,
                                   max=MAX_COUNT)
    pace: str = _f("learner", "learner: as fast as the learner keeps up (sacbot run and cluster wait between "
                              "ticks while it is over half a --queue-size of transitions behind, so nothing "
                              "is dropped and every transition gets its --utd-ratio updates); free: as fast "
                              "as possible, dropping what the learner cannot take; realtime: fixed tick "
                              "clock at --tps; lockstep: acting waits for each step's owed updates "
                              "(deterministic, for sample-efficiency comparisons). A game's own loop "
                              "(Agent, serve) never waits whatever the pace, except in lockstep.",
                   choices=("learner", "free", "realtime", "lockstep"))
    # 100,000: a 10 us tick, shorter than act() itself; past it realtime pace is free pace.
    tps: float = _f(30.0, "Ticks per second in realtime pace.", min=1e-3, max=100_000.0)
    eval_mode: bool = _f(False, "Eval mode: deterministic actions, nothing sent to the learner, "
                                "nothing saved.", flag="--eval")
    run_dir: str = _f("runs/default", "Directory for status.json, metrics and episode logs.")
    weights_path: str = _f("weights", "Directory for checkpoints and the round counter; or, as the "
                                      "original bot took it, the path of the newest checkpoint itself "
                                      "(a name ending in .zip, e.g. weights/sac_latest.zip).")
    quiet: bool = _f(False, "No live progress line.")
    # --- learner -------------------------------------------------------------------
    # The maxima below are ceilings against typos: past them an allocation fails
    # with a MemoryError or torch crashes, so a clear error up front is kinder.
    # hidden 4096: each LSTM holds 4h(h + in) weights, ~64M at 4096, times actor, critic,
    # target and Adam's two moments: gigabytes already.
    # hidden 1024: the learner's arrays (~67M floats at 1024: actor, critic, target, Adam's moments)
    # fit sacbot's 1 GiB checkpoint cap with the default replay; at 2048 no checkpoint would fit
    # whatever the other settings, so the bot could never be saved.
    hidden: int = _f(64, "LSTM hidden size of actor and critic (at most 1024).", min=1, max=1024, group="learner")
    batch_size: int = _f(16, "Sequences per gradient step (B).", min=1, max=4096, group="learner")
    seq_len: int = _f(32, "Steps per sampled sequence (L).", min=1, max=1024, group="learner")
    burn_in: int = _f(0, "Steps before each sequence used only to warm the recurrent state.",
                      min=0, max=1024, group="learner")
    utd_ratio: float = _f(1.0, "Gradient steps per transition received; may be fractional (0: store "
                                "without training; at most 256, what one training pass takes).",
                          min=0.0, max=MAX_UTD_RATIO, group="learner")
    learning_starts: int = _f(1000, "Transitions in the buffer before the first gradient step.",
                              min=0, max=10_000_000, group="learner")  # what the largest buffer holds
    # 10M rows: ~3 GB preallocated at TankDuel's 35-float observation (obs and next_obs).
    buffer_size: int = _f(100_000, "Replay capacity in transitions (at most 10,000,000).", min=1,
                          max=10_000_000, group="learner")
    gamma: float = _f(0.99, "Discount factor.", min=0.0, max=1.0, group="learner")
    n_step: int = _f(1, "Rewards summed before bootstrapping (n-step returns) inside a sampled sequence; 1: the "
                        "one-step target. TankDuel's preset sets 5 (a hit's reward lands ~30 ticks after the shot). "
                        "The memoryless control's sequences are one step long, so it keeps 1.",
                     min=1, max=1024, group="learner")
    tau: float = _f(0.005, "Polyak rate of the target critic.", min=0.0, max=1.0, group="learner")
    # Adam moves each weight by about lr per step: at 10 the critic's gradients overflowed within
    # 7 steps (Pendulum-v1); 1 still trained.
    lr: float = _f(3e-4, "Adam learning rate of actor, critic and temperature (at most 1).", min=0.0, max=1.0,
                   group="learner")
    init_alpha: float = _f(1.0, "Initial entropy temperature (learned from there). 1.0 (SB3's default) "
                                "suits dense-reward envs such as Pendulum-v1; TankDuel's preset sets 0.02, "
                                "its rewards being small next to the entropy bonus.", min=1e-8,
                           max=1e6, group="learner")
    # The ceiling: no policy squashed into [-1, 1] has more entropy per dimension than the uniform
    # one, log 2 = 0.69; at a target above that the temperature would grow without bound.
    target_entropy_per_dim: float = _f(-1.0, "Entropy the temperature holds the policy at, per action dimension "
                                             "(the target is this times the action size). -1: SAC's heuristic "
                                             "(SB3's 'auto', -dim(A)). Higher explores more.",
                                       min=-10.0, max=0.5, group="learner")
    noise_color: float = _f(0.0, "Exploration noise's spectrum, 1/f^beta along time: 0 white (SAC's own, a fresh "
                                 "draw each tick), 1 pink, 2 red. Coloured noise keeps each tick's draw a unit "
                                 "Gaussian but correlates it with its neighbours, so exploration can push one way "
                                 "for many ticks; it restarts each episode, and above 0 the warm-up before "
                                 "learning_starts acts on it too (tanh of the draw) instead of uniformly. Pink "
                                 "reached MountainCar's flag in 11 of 12 suite runs where white never did, but "
                                 "balanced InvertedDoublePendulum-V worse (BENCHMARKS.md): an option, not the default.",
                             min=0.0, max=3.0, group="learner")
    memoryless: bool = _f(False, "Control experiment: reset the recurrent state (and previous action) "
                                 "every step, in acting and in training (batch_size * seq_len sequences of 1).",
                           group="learner")
    critic_memory: bool = _f(True, "The critic reads the history through its LSTM (on) or each step alone, "
                                   "(observation, previous action) from a zero state (off). Off suits an env "
                                   "whose critic-only values (critic_obs) carry the hidden state: the critic "
                                   "then sees the state itself. The actor keeps its memory either way.",
                              group="learner")
    critic_layer_norm: bool = _f(True, "Layer norm on each hidden layer of the critic's Q heads (as RLPD, Ball et "
                                       "al. 2023, and BRO do): it bounds what the heads can extrapolate from a "
                                       "few replayed histories. On across the robustness suite it halved the seeds "
                                       "that fail to learn (BENCHMARKS.md). Off: the plain heads, as bots saved "
                                       "before it became the default have.",
                                 group="learner")
    critic_head_layers: int = _f(1, "Hidden layers of each Q head, which reads the critic's LSTM output and the "
                                    "action: with one, the action meets the history in a single layer; SB3's "
                                    "critic has two on (observation, action).", min=1, max=4, group="learner")
    critic_head_width: int = _f(128, "Units of each hidden layer of the Q heads (at most 4096).", min=1, max=4096,
                                group="learner")
    reward_input: bool = _f(False, "Give the actor and critic the previous reward as one more input (pomdp-baselines "
                                   "does): it reveals state that a partial observation hides (Pendulum-V: the "
                                   "angle). Pendulum-V's preset turns it on. It shares the input "
                                   "quantizer's one scale with the observation, so rewards should be of the "
                                   "observation's size (or squashed: reward_input_squash); the game must call "
                                   "observe() every tick, eval too.",
                            group="learner")
    reward_input_squash: str = _f("off", "How reward_input's previous reward is shaped before the networks read it: "
                                         "off (as the game gives it) or symlog (sign(r) ln(1 + |r|)), which keeps "
                                         "rewards of any scale (+/-100 a crash, ~9 a tick) near the observation's "
                                         "size for the input quantizer's one scale. The reward learnt from is "
                                         "never changed.", choices=("off", "symlog"), group="learner")
    critic_obs: int = _f(0, "How many of the observation's last values only the critic reads: information for "
                            "training that the actor, and so the deployed policy, never sees (an asymmetric "
                            "critic). An env that declares such values (its critic_obs attribute, e.g. "
                            "sacbot/TankDuelRadar-v1's true enemy state) sets this itself.", min=0,
                         max=MAX_COUNT, group="learner")
    quant: str = _f("on", "Quantization-aware actor (on) or plain fp32 (off).",
                    choices=("on", "off"), group="learner")
    quant_bits: int = _f(8, "Bits of the quantized actor's weights and inputs.", min=3, max=8,
                         group="learner")
    calib_updates: int = _f(500, "Updates observed in fp32 before fake quantization starts.",
                            min=1, max=MAX_COUNT, group="learner")
    device: str = _f("cpu", "Torch device of the learner (cpu, cuda, cuda:N).", group="learner")
    # 256: torch segfaulted at 100000; no machine sacbot targets has more cores.
    torch_threads: int = _f(1, "Torch intra-op threads of the learner (at most 256).", min=1, max=256,
                            group="learner")
    # Measured with one other CPU-bound process on a 2-core machine: at the bot's own priority
    # the learner preempted the acting thread for a whole scheduler tick (~4 ms) in 0.25-0.5% of
    # act() calls; at +10 in 0.03-0.07% (docs/design.md, "Who gets the CPU").
    learner_nice: int = _f(10, "Niceness the learner adds to its own thread or process, so that acting wins "
                               "the CPU when both are runnable (0 to 19; 0 keeps the bot's priority). Linux "
                               "sets it per thread; elsewhere only a process learner gets it (a thread learner "
                               "warns).",
                           min=0, max=19, group="learner")
    # Below any niceness: the kernel preempts a SCHED_IDLE thread the moment a normal one wakes, so
    # acting never waits out the learner's time slice; but the learner gets no core that other work
    # wants (with every core busy it could not even start in 300 s, docs/experiments.md).
    learner_idle: bool = _f(False, "Also run the learner under Linux's SCHED_IDLE policy: acting preempts it at once, "
                                   "but it only gets the CPU no other work wants (on a machine whose cores are all "
                                   "busy it may not run at all). Linux only; elsewhere a warning, and niceness alone.",
                            group="learner")
    # --- runtime -------------------------------------------------------------------
    learner: str = _f("thread", "Where the learner runs: thread (in the bot's process) or process (a child process: "
                                "acting gets an interpreter of its own, no GIL shared with training).",
                      choices=("thread", "process"), group="runtime")
    queue_size: int = _f(256, "Capacity of the acting-to-training queue.", min=1, max=1_000_000,
                         group="runtime")
    final_save_timeout: float = _f(300.0, "Seconds a close (the end of a run, SIGINT/SIGTERM) waits for the "
                                          "learner's final save. Past them the bot exits anyway (code 3, saying "
                                          "the final save was not confirmed; a learner process is killed) and "
                                          "the next start goes on from the last confirmed save.",
                                   min=1.0, max=86400.0, group="runtime")
    opponent_policy: str = _f("clear", "Replay policy when the opponent changes.",
                              choices=("clear", "keep"), group="runtime")
    save_interval: int = _f(5000, "Offer a checkpoint every N gradient steps (500 by default under the "
                                  "original bot's contract, --original).", min=1, max=MAX_COUNT, group="runtime")
    original: bool = _f(False, "Keep the original bot's contract: training_metrics.jsonl's epoch is wall-clock "
                               "seconds, a line is written only for passes with gradient steps, and "
                               "save_interval defaults to 500. On by itself when the weights path names a .zip "
                               "or any SACLSTM_* variable is set.", group="runtime")
    keep_last: int = _f(5, "Step-named checkpoints kept besides sac_latest.zip.", min=0, max=MAX_COUNT,
                        group="runtime")
    save_replay: bool = _f(True, "Store the replay buffer in checkpoints for exact resume.",
                           group="runtime")
    no_fresh_start: bool = _f(False, "Refuse to start when checkpoints exist but none loads.",
                              group="runtime")
    transfer: bool = _f(False, "Go on from a bot saved in another env, or in this env with kwargs that change what "
                               "its observations or actions mean (transfer learning; evaluating a bot in a variant "
                               "of its game). Without it such a weights directory is refused, so a mistyped --env "
                               "cannot train over a trained bot. The spaces must fit either way.", group="runtime")
    tensorboard: str = _f("", "Directory for TensorBoard event files: training metrics, episode returns and win "
                              "rates, evals and act latency, read from the JSONL files (needs the tensorboard "
                              "extra: pip install 'sacbot[tensorboard]'); empty: off.", group="runtime")

    def __post_init__(self):
        for f in fields(self):
            _check(f, getattr(self, f.name))
        for name in ("run_dir", "weights_path"):
            if not getattr(self, name).strip():
                raise ConfigError(f"{name} = {getattr(self, name)!r} is not accepted: expected a path")
        if self.tensorboard and not self.tensorboard.strip():  # "" is off; " " made a directory named " "
            raise ConfigError(f"tensorboard = {self.tensorboard!r} is not accepted: expected a directory path, "
                              "or empty for off")
        if self.original_layout and os.path.basename(self.weights_path) == ".zip":
            raise ConfigError(f"weights_path = {self.weights_path!r} is not accepted: expected a directory "
                              "or a checkpoint file name ending in .zip")
        if self.original_layout and not self.eval_mode and STEP_RE.match(os.path.basename(self.weights_path)):
            # As the newest-checkpoint name, a step file would be overwritten by the next save, and the
            # state it names lost.  (Eval saves nothing: it may read one.)
            raise ConfigError(f"weights_path = {self.weights_path!r} is not accepted: it names a step "
                              "checkpoint, which the next save would overwrite; pass its directory to go on from the "
                              "newest checkpoint there, or copy the file into a new directory as "
                              "sac_latest.zip to go on from that step")
        if not self.eval_mode and self._kept_apart():
            # Files sacbot keeps for another purpose: the runner's best bot (it copies the best eval
            # there) and the bots eval falls back to.  Training would overwrite them with every save,
            # or put its own bot among the pretrained ones.
            raise ConfigError(f"weights_path = {self.weights_path!r} is not accepted for training: it names a bot "
                              "sacbot keeps apart (the runner's best.zip, or a pretrained/ directory or a bot in "
                              "one), which every save would overwrite or join; copy the bot into a new directory "
                              "as sac_latest.zip and pass that directory to train on from it")
        if self.original_layout and os.path.isdir(self.weights_path):
            # Read as a checkpoint file, a directory would be moved aside as unusable and a fresh bot
            # started beside it.
            raise ConfigError(f"weights_path = {self.weights_path!r} is not accepted: it is a directory, not "
                              "a checkpoint file; pass it as it is named only if it is a file (a directory "
                              "whose name ends in .zip cannot be a weights directory)")
        self.env_kwargs_dict()  # validates
        # A buffer that can never hold what learning waits for: the run would play on with 0 gradient
        # steps.  (To store without training, --utd-ratio 0 says so.)
        if self.learning_starts > self.buffer_size:
            raise ConfigError(f"learning_starts = {self.learning_starts} is more than buffer_size = "
                              f"{self.buffer_size}: the buffer never holds that many transitions, so no gradient "
                              "step would ever run; lower --learning-starts or raise --buffer-size")
        if self.critic_obs and self.reward_input:
            # reward_input appends the previous reward after the critic's values, where the actor
            # would not read it; an actor input that is not one leading slice is not built.
            raise ConfigError("critic_obs and reward_input cannot be combined: the previous reward would land "
                              "among the values only the critic reads; turn one off")
        rows = self.batch_size * self.seq_len if self.memoryless else self.batch_size  # window starts a batch needs
        if rows > self.buffer_size:
            raise ConfigError(f"batch_size = {self.batch_size}{' x seq_len (memoryless)' if self.memoryless else ''} "
                              f"needs {rows} stored transitions to start its windows at, more than buffer_size = "
                              f"{self.buffer_size}: no gradient step would ever run; raise --buffer-size")

    def _kept_apart(self) -> bool:
        path = os.path.normpath(self.weights_path)
        if not self.original_layout:  # a directory: the pretrained bots' own
            return os.path.basename(path).lower() == "pretrained"
        return os.path.basename(path).lower() == "best.zip" \
            or os.path.basename(os.path.dirname(path)).lower() == "pretrained"

    def env_kwargs_dict(self) -> dict:
        """``env_kwargs`` as the dict passed to the env; ConfigError naming it if it is not a
        JSON object (or sets render_mode, which sacbot never uses to play)."""
        if not self.env_kwargs.strip():
            return {}
        shown = repr(self.env_kwargs) if len(self.env_kwargs) <= 300 else \
            f"{self.env_kwargs[:300]!r}... ({len(self.env_kwargs):,} characters)"
        try:
            d = json.loads(self.env_kwargs)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, a 5,000-digit number, 20,000-deep nesting
            raise ConfigError(f"env_kwargs = {shown} is not accepted: expected a JSON object ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"env_kwargs = {shown} is not accepted: expected a JSON object")
        if "render_mode" in d:  # "human" failed inside gymnasium with advice to install pygame
            raise ConfigError(f"env_kwargs = {shown} is not accepted: sacbot plays without rendering, so it sets "
                              "no render_mode; drop it (sacbot render draws an episode)")
        return d

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data: what a checkpoint's manifest and RUN_DIR/config.toml hold."""
        return dataclasses.asdict(self)

    # --- where files go ----------------------------------------------------------------
    # The original bot's weights path named the newest checkpoint itself; sacbot's names a
    # directory.  These properties give every file's place for both, so callers never test
    # the layout themselves.

    @property
    def original_layout(self) -> bool:
        """weights_path names a checkpoint file (…/sac_latest.zip), as the original bot's did."""
        return self.weights_path.lower().endswith(".zip")

    @property
    def original_contract(self) -> bool:
        """The original bot's metrics and save interval (``original``, or its file layout)."""
        return self.original or self.original_layout

    @property
    def weights_dir(self) -> str:
        """The directory of the checkpoints, round counter and save receipts."""
        if self.original_layout:
            return os.path.dirname(self.weights_path) or "."
        return self.weights_path

    @property
    def latest_name(self) -> str:
        """File name of the newest checkpoint inside ``weights_dir``."""
        return os.path.basename(self.weights_path) if self.original_layout else "sac_latest.zip"

    @property
    def _own_prefix(self) -> str:
        """'' for sac_latest.zip; ``<name>.`` for a bot kept as any other ``<name>.zip``, so that
        bots sharing one folder never read or overwrite each other's files."""
        name = self.latest_name
        return "" if name == "sac_latest.zip" else name[: -len(".zip")] + "."

    @property
    def round_counter_path(self) -> str:
        """The round counter's path: one per bot, even for bots sharing a folder."""
        return os.path.join(self.weights_dir, self._own_prefix + "round_counter.txt")

    @property
    def metrics_path(self) -> str:
        """``run_dir/training_metrics.jsonl``; in the original layout the weights directory's
        parent holds it, where the original's campaign scripts read it."""
        if self.original_layout:
            parent = os.path.dirname(os.path.abspath(self.weights_dir))
            return os.path.join(parent, self._own_prefix + "training_metrics.jsonl")
        return os.path.join(self.run_dir, "training_metrics.jsonl")


STEP_RE = re.compile(r"^sac_step_(\d+)\.zip$")  # the step checkpoints' names (sacbot/store/checkpoint.py)


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
        return f"{kind} in [{_fmt(lo)}, {_fmt(hi)}]"
    if lo is not None:
        return f"{kind} >= {_fmt(lo)}"
    return kind


def _fmt(x: float) -> str:
    if x == MAX_SEED:
        return "2**63 - 1"
    return f"{x:,}" if isinstance(x, int) and x >= 10_000 else str(x)


# What each field type holds once coerced; bool is an int to Python, so it is kept apart.
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _type_ok(f: dataclasses.Field, value: Any) -> bool:
    typ = str(f.type)
    if typ not in _TYPES:
        return True
    return isinstance(value, _TYPES[typ]) and (typ == "bool" or not isinstance(value, bool))


def _check(f: dataclasses.Field, value: Any) -> None:
    m = f.metadata
    bad = not _type_ok(f, value)
    if m.get("choices") and value not in m["choices"]:
        bad = True
    if not bad and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            bad = True
        elif m.get("min") is not None and value < m["min"]:
            bad = True
        elif m.get("max") is not None and value > m["max"]:
            bad = True
    if bad:
        raise ConfigError(f"{f.name} = {value!r} is not accepted: expected {_accepted(f)}")
