"""The training side: drain experience, then train, so every pass learns from all that has arrived.

The logic is two plain functions of a :class:`TrainingState`, testable without
threads::

    state = TrainingState.fresh(cfg, obs_dim, act_dim)
    for msg in messages:
        handle_message(state, msg)          # into the buffer; opponent policy
    line = train_pass(state, offer_save)    # UTD steps, saves inside the loop

:class:`LearnerLoop` is a thin loop around them, the same whether it runs on a thread of the
bot's process (:mod:`sacbot.learning.thread_learner`) or in a child process
(:mod:`sacbot.learning.process_learner`): it builds the learner from plain data (a :class:`LearnerSpec` and
a checkpoint payload) inside the thread or process that owns it, blocks for one message (with a
timeout so a stop is always seen), takes everything else queued, runs a pass, appends a metrics
line, publishes the actor and pushes a plain status dict.  ``Shutdown`` ends it: what was
queued before it goes into the buffer untrained, the final save is made, the writer stops.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from sacbot.config import Config, ConfigError
from sacbot.learning.io_thread import IOThread
from sacbot.learning.priority import yield_cpu_to_acting
from sacbot.learning.replay import SequenceReplay
from sacbot.learning.sac import NonFiniteError, SACLSTMLearner, check_finite
from sacbot.store.files import append_jsonl
from sacbot.wire.boundary import LearnerSpec
from sacbot.wire.channels import SaveSlot
from sacbot.wire.messages import NewEpisode, Shutdown, Transition, Transitions
from sacbot.wire.status import LearnerStatus

log = logging.getLogger("sacbot")


@dataclass
class TrainingState:
    cfg: Config
    learner: SACLSTMLearner
    replay: SequenceReplay
    rng: np.random.Generator
    grad_steps: int = 0
    env_steps: int = 0  # transitions received
    passes: int = 0  # training passes run (the metrics line's "epoch")
    episodes: int = 0
    utd_carry: float = 0.0
    opponent: dict[int, str] = field(default_factory=dict)  # source -> its last opponent
    pending: int = 0  # transitions handled since the last pass
    save_offers_dropped: int = 0
    losses: dict = field(default_factory=dict)

    @classmethod
    def fresh(cls, cfg: Config, obs_dim: int, act_dim: int) -> TrainingState:
        return cls(cfg, SACLSTMLearner(obs_dim, act_dim, cfg),
                   SequenceReplay(cfg.buffer_size, obs_dim, act_dim),
                   np.random.default_rng(cfg.seed))

    # --- plain-data snapshot for checkpoints ---------------------------------------
    def payload(self, with_replay: bool, since: dict[int, int] | None = None) -> dict:
        """Plain data for a checkpoint.  With the replay, ``payload["replay_chunks"]`` carries its
        row chunks, less those whose generation ``since`` says the writer already holds."""
        arrays, lmeta = self.learner.state()
        arrays.update({f"export.{k}": v for k, v in self.learner.export_actor().items()})
        meta = {"grad_steps": self.grad_steps, "env_steps": self.env_steps, "passes": self.passes,
                "episodes": self.episodes, "utd_carry": self.utd_carry,
                "opponents": [[k, v] for k, v in sorted(self.opponent.items())], "learner": lmeta,
                "rng_numpy": json.dumps(self.rng.bit_generator.state)}
        out = {"arrays": arrays, "meta": meta}
        if with_replay:
            out["replay_chunks"], meta["replay"] = self.replay.export_chunks(since)
        return out

    def load_payload(self, arrays: dict, meta: dict, saved_utd_ratio: float | None = None) -> None:
        """``saved_utd_ratio``: the ratio the checkpoint was trained at (its manifest's config), so
        that steps it still owed are counted again at this run's ratio (``resumed_carry``)."""
        self.learner.load_state(arrays, meta["learner"])
        self.grad_steps, self.env_steps = int(meta["grad_steps"]), int(meta["env_steps"])
        self.episodes = int(meta["episodes"])
        self.utd_carry = resumed_carry(float(meta["utd_carry"]), saved_utd_ratio, self.cfg.utd_ratio)
        self.passes = int(meta.get("passes", 0))  # older checkpoints did not count them
        if "opponents" in meta:  # msgpack keys must be strings: saved as [source, opponent] pairs
            self.opponent = {int(k): v for k, v in meta["opponents"]}
        else:  # one bot's checkpoint: its opponent is source 0's
            self.opponent = {} if meta.get("opponent") is None else {0: meta["opponent"]}
        self.rng.bit_generator.state = json.loads(meta["rng_numpy"])
        if "replay" in meta:
            self.replay.load(arrays, meta["replay"])


def handle_message(state: TrainingState, msg, source: int = 0) -> bool:
    """Apply one message of bot ``source``.  Returns True for Shutdown."""
    if isinstance(msg, Transition):
        state.replay.add(msg.obs, msg.action, msg.reward, msg.next_obs, msg.terminated, msg.truncated, source)
        state.env_steps += 1
        state.pending += 1
    elif isinstance(msg, Transitions):  # a run of one bot's transitions, as a batch carries them
        state.replay.add_batch(msg.obs, msg.action, msg.reward, msg.next_obs, msg.terminated, msg.truncated,
                               source)
        state.env_steps += len(msg)
        state.pending += len(msg)
    elif isinstance(msg, NewEpisode) and msg.gap:
        state.replay.start_episode(source)  # the episode goes on, in a new chain: nothing else changes
    elif isinstance(msg, NewEpisode):
        state.replay.start_episode(source)
        last = state.opponent.get(source)
        if last is not None and msg.opponent != last and state.cfg.opponent_policy == "clear":
            # Experience against another opponent would mislead the critic: its values were
            # earned against another policy.  Only this source's: the other bots' rows were
            # collected against their own opponents.
            state.replay.clear(source)
        state.opponent[source] = msg.opponent
        state.episodes += 1
    elif isinstance(msg, Shutdown):
        return True
    else:
        raise TypeError(f"unknown message {type(msg).__name__}")
    return False


MAX_PASS_STEPS = 256  # ~1-3 s of updates at the default sizes on one core; Config's MAX_UTD_RATIO too


def resumed_carry(carry: float, saved_ratio: float | None, ratio: float) -> float:
    """The UTD carry a resumed run starts with, from the one its checkpoint saved.

    The carry is gradient steps owed for transitions already received: a fraction, plus the steps
    of a pass cut short by a stop or by ``MAX_PASS_STEPS``.  Those transitions owe what the
    current ratio says, so a carry saved at another ratio is rescaled (steps / saved ratio =
    transitions' worth; times this ratio = steps now): a changed ``--utd-ratio`` takes effect at
    once, ``--utd-ratio 0`` owes nothing, and an unchanged one resumes exactly.  The result is
    then kept below ``1 + MAX_PASS_STEPS``, one pass: what a lockstep run can owe at a stop (at most
    one step's worth, the ratio, plus a fraction) is kept whole, while a backlog of a learner that
    fell behind, or a huge carry from a ratio no longer accepted, cannot hold the new setting off
    past the first pass.  Without the saved ratio (a checkpoint without a config) only the bound
    applies."""
    if math.isnan(carry) or carry < 0:
        carry = 0.0
    if saved_ratio is not None and math.isfinite(saved_ratio) and saved_ratio >= 0 and saved_ratio != ratio:
        # A saved ratio of 0 owed nothing per transition: what it carried was never owed.
        carry = carry / saved_ratio * ratio if saved_ratio > 0 else 0.0
    if math.isnan(carry):  # inf / inf
        carry = 0.0
    return min(carry, math.nextafter(1.0 + MAX_PASS_STEPS, 0.0))


def steps_owed(state: TrainingState) -> int:
    """Gradient steps for the transitions drained: pending x UTD, remainder carried."""
    owed = state.pending * state.cfg.utd_ratio + state.utd_carry
    n = math.floor(owed + 1e-9)
    # The tolerance rounds 2.9999999999999 up to 3 steps; what is left is then a hair below 0, which
    # a checkpoint must not hold (its validation refused such a final save): never less than none.
    state.utd_carry = max(0.0, owed - n)
    state.pending = 0
    return n


def _windows(cfg) -> tuple[int, int, int]:
    """(batch, seq_len, burn_in) of each sampled batch.  The memoryless control takes each step
    alone, as many transitions per update as the recurrent learner sees (batch_size * seq_len)."""
    if cfg.memoryless:
        return cfg.batch_size * cfg.seq_len, 1, 0
    return cfg.batch_size, cfg.seq_len, cfg.burn_in


def ready_to_learn(state: TrainingState) -> bool:
    batch, seq, _ = _windows(state.cfg)
    return len(state.replay) >= max(state.cfg.learning_starts, 1) and state.replay.can_sample(batch, seq)


PUBLISH_EVERY_STEPS = 64  # inside a long pass too: bots act on an actor at most this many steps old


def train_pass(state: TrainingState, offer_save: Callable[[TrainingState], bool] | None = None,
               stop: threading.Event | None = None, publish: Callable[[], None] | None = None) -> dict:
    """Run the gradient steps owed.  Returns the pass's metrics (losses averaged).
    If ``stop`` is set mid-pass, the steps not taken stay owed (carried), so a close is
    prompt and a resumed run still takes them.  ``publish`` is called every
    ``PUBLISH_EVERY_STEPS`` steps of a longer pass (by count, so lockstep runs stay exact); the
    caller publishes at its end."""
    cfg = state.cfg
    drained = state.pending
    n = steps_owed(state)  # consumes what was drained; the fraction carries
    if not ready_to_learn(state):
        n = 0  # steps owed before learning starts are not made up later
    elif n > MAX_PASS_STEPS:
        # A learner behind its bots (a cluster, a burst) would otherwise run one pass of thousands of
        # steps, publishing and reporting nothing meanwhile; the rest stays owed for the next passes.
        state.utd_carry += n - MAX_PASS_STEPS
        n = MAX_PASS_STEPS
    sums: dict[str, float] = {}
    done = 0
    n_seq, seq_len, burn_in = _windows(cfg)
    for i in range(n):
        if stop is not None and stop.is_set():
            state.utd_carry += n - i
            break
        done += 1
        batch = state.replay.sample(n_seq, seq_len, state.rng, burn_in)
        if cfg.memoryless:  # no previous action either (the learner reads every step alone)
            batch = batch._replace(prev_act0=np.zeros_like(batch.prev_act0))
        m = state.learner.update(batch)
        bad = {k: v for k, v in m.items() if not math.isfinite(v)}
        if bad:  # the step has already moved the weights: stop before anything leaves
            raise NonFiniteError(f"gradient step {state.grad_steps + 1} gave non-finite "
                                 + ", ".join(f"{k}={v}" for k, v in bad.items()))
        state.grad_steps += 1
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v
        # Inside the loop: a long burst of steps still produces saves, so a crash mid-burst
        # loses at most save_interval steps.
        if offer_save is not None and state.grad_steps % cfg.save_interval == 0:
            if not offer_save(state):
                state.save_offers_dropped += 1
        if publish is not None and done % PUBLISH_EVERY_STEPS == 0 and done < n:
            publish()
    avg = {k: v / done for k, v in sums.items()} if done else {}
    if avg:
        state.losses = avg
    state.passes += 1
    # The original bot's nine fields, with its names and meanings: existing campaign scripts
    # read them.  sacbot's own fields come after.
    return {"epoch": state.passes, "steps": state.grad_steps, "buffer_size": len(state.replay),
            "drained": drained, "grad_steps": done, **avg, "quant_phase": state.learner.quant_phase}




class _Either:
    """Set when any of its events is (``threading.Event`` or ``multiprocessing.Event``)."""

    def __init__(self, *events):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class LearnerLoop:
    """Owns the learner, the replay and the I/O thread.  ``inbox`` has ``recv(timeout)`` and
    ``drain()``; ``publish(arrays) -> version`` and ``push_status(LearnerStatus)`` carry results out.
    Errors are caught at the top: recorded in status, logged with the traceback, and in the
    metrics.  After an error the loop trains no more but still answers Shutdown with the final
    save, unless the learner's state is not finite (then the last good checkpoint stays)."""

    def __init__(self, spec: LearnerSpec, checkpoint: dict | None, inbox, publish: Callable[[dict], int],
                 push_status: Callable[[LearnerStatus], None], stop: threading.Event):
        self.spec, self.checkpoint, self.inbox = spec, checkpoint, inbox
        self.publish, self.push_status, self.stop = publish, push_status, stop
        self.state: TrainingState | None = None
        self.io: IOThread | None = None
        self.save_slot = SaveSlot()
        self.held: dict[int, int] = {}  # replay chunks the writer holds, from its results
        self.error: str | None = None
        self.poisoned = False
        self.processed = 0  # transitions whose pass has completed (lockstep pace)
        self.steps_per_s = 0.0
        self.version = 0
        self.last_save: dict | None = None
        self.save_errors = 0
        self.saves = 0
        self.last_save_error: str | None = None
        self.final_save: dict | None = None
        self.torch_threads = 0
        self.nice: int | None = None  # the learner's niceness as measured once lowered
        self.priority_set = False  # a process learner lowers its whole process before its threads
        self.learning = False
        self.original = False  # the original bot's metrics contract (Config.original_contract), set by _build
        # Set by a close: the pass in progress ends at its next step (the rest stays owed), so a
        # Shutdown behind a long pass is taken at once.  A process learner's is its parent's.
        self.closing = threading.Event()
        self.discard = False  # the bot failed to start: end without a final save (nothing is written)

    # --- build, inside the owning thread or process -----------------------------------------
    def _start(self) -> bool:
        """Build; a failure here is reported as a start error and nothing is written.  Only a
        ConfigError (a setting the learner refuses, or a sound checkpoint these settings cannot
        resume) is a config error (exit 2): anything else is a failure of the learner (exit 1)
        and says what it was, so a bug never reads as a bad setting."""
        try:
            self._build()
        except Exception as e:  # noqa: BLE001 - reported to the assembler, which raises it
            config = isinstance(e, ConfigError)
            self.error = str(e) if config else f"the learner failed to build: {type(e).__name__}: {e}"
            if self.io is not None:
                self.io.stop(10.0)
            self.final_save = {"ok": False, "error": "the learner never started"}
            self.push_status(self.status().but(learner_alive=False, start_error=self.error,
                                               start_error_kind="config" if config else "other", closed=True))
            return False
        self.push_status(self.status())
        return True

    def _build(self) -> None:
        spec, cfg = self.spec, self.spec.cfg()
        self.original = cfg.original_contract
        # Here, in the thread or process that trains: MKL keeps its thread count per thread, and a
        # thread that never set it ran its GEMMs on every core (docs/experiments.md).
        torch.set_num_threads(cfg.torch_threads)
        self.torch_threads = torch.get_num_threads()  # measured, not configured
        self.state = TrainingState.fresh(cfg, spec.obs_dim, spec.act_dim)
        if self.checkpoint is not None:
            saved = self.checkpoint.get("manifest", {}).get("config", {}).get("utd_ratio")
            saved = float(saved) if isinstance(saved, int | float) and not isinstance(saved, bool) else None
            try:  # the file verified: what fails here is these settings against it, the user's to change
                self.state.load_payload(self.checkpoint["arrays"], self.checkpoint["meta"], saved_utd_ratio=saved)
            except (KeyError, ValueError, TypeError, RuntimeError) as e:
                raise ConfigError(f"a sound checkpoint these settings cannot resume: {type(e).__name__}: {e}") from e
            self.checkpoint = None  # the replay arrays are in the buffer now: free the copy
        self.io = IOThread(self.save_slot, spec.weights_dir, cfg.keep_last, spec.config, spec.spaces,
                           latest_name=spec.latest_name)
        self.io.start()
        self._publish()

    def _publish(self) -> None:
        assert self.state is not None
        actor = self.state.learner.export_actor()
        check_finite(actor, "actor snapshot")  # acting keeps the last good weights
        self.version = self.publish(actor)

    def status(self) -> LearnerStatus:
        """The status the acting side shows; computed here, from the learner's objects."""
        st = LearnerStatus(learner_alive=self.error is None, learner_error=self.error, processed=self.processed,
                           learner_pid=os.getpid(), policy_version_published=self.version,
                           last_error=self.error or self.last_save_error, last_save=self.last_save,
                           saves=self.saves, save_errors=self.save_errors, torch_threads=self.torch_threads,
                           learner_nice=self.nice, grad_steps_per_s=round(self.steps_per_s, 2),
                           final_save=self.final_save)
        s = self.state
        if s is not None:
            st = st.but(learner_steps=s.grad_steps, env_steps_received=s.env_steps, buffer_size=len(s.replay),
                        quant_phase=s.learner.quant_phase, save_drops=s.save_offers_dropped,
                        device=str(s.learner.device), losses=dict(s.losses))
        return st

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        acting_rng = None
        try:
            if not self.priority_set:
                cfg = self.spec.cfg()
                self.nice, self.priority_set = yield_cpu_to_acting(cfg.learner_nice, cfg.learner_idle), True
            if not self._start():
                return
            acting_rng = self._loop()
        except BaseException as e:  # noqa: BLE001 - recorded, logged, reported at exit
            self._fail(e)
            acting_rng = self._wait_for_shutdown()
        finally:
            self._finish(acting_rng)

    def _loop(self) -> str | None:
        """Drain, then train, until Shutdown (returns its acting_rng) or the stop event."""
        assert self.state is not None
        while not self.stop.is_set():
            msg = self.inbox.recv(timeout=0.1)
            if msg is None:
                if self.state.utd_carry >= 1 and ready_to_learn(self.state):
                    self._pass()  # steps still owed from a capped pass: no need to wait for data
                elif self._collect_io():
                    self.push_status(self.status())  # a save finished while no data came
                continue
            # An item is a Message (source 0) or a (source, Message) pair from a many-bot learner.
            items = [m if isinstance(m, tuple) else (0, m) for m in [msg] + self.inbox.drain()]
            end = next((i for i, (_, m) in enumerate(items) if isinstance(m, Shutdown)), None)
            shutdown = None if end is None else items[end][1]
            if end is not None:  # what came before it goes in; nothing after it is sent
                items = items[:end]
            for source, m in items:
                handle_message(self.state, m, source)
            if shutdown is not None:
                self.state.pending = 0  # queued transitions go into the buffer untrained: a prompt close
                return shutdown.acting_rng or None
            if self.state.pending:
                self._pass()
        return None

    def _pass(self) -> None:
        s = self.state
        assert s is not None
        drained = s.pending
        if not self.learning and ready_to_learn(s):
            self.learning = True  # said once: tells a person (or a test) training began
            log.info("learning started with %d transitions in the buffer", len(s.replay))
        t0 = time.perf_counter()
        line = train_pass(s, self._offer_save, _Either(self.stop, self.closing), self._publish_mid_pass)
        dt = time.perf_counter() - t0
        if line["grad_steps"]:
            self.steps_per_s = line["grad_steps"] / max(dt, 1e-9)
        self._publish()
        self._collect_io()
        now = time.time()
        line.update(wall_time=now, policy_version=self.version, save_drops=s.save_offers_dropped)
        if not self.original:
            append_jsonl(self.spec.metrics_path, line)
        elif line["grad_steps"]:  # the original's contract: epoch is its epochTime(), no line for an idle pass
            append_jsonl(self.spec.metrics_path, {**line, "epoch": now, "passes": line["epoch"]})
        self.processed += drained
        self.push_status(self.status())

    def _publish_mid_pass(self) -> None:
        # A pass is up to MAX_PASS_STEPS long: on a loaded machine (seen: 2.9 steps/s in a cluster
        # sharing two cores with other work) that is over a minute in which status would still say
        # 0 steps and no save, though both happened.
        self._publish()
        self._collect_io()
        self.push_status(self.status())

    def _offer_save(self, state: TrainingState) -> bool:
        self._collect_io()
        if not self.save_slot.has_room():  # build the (large) payload only when the writer can take it
            return False
        payload = state.payload(state.cfg.save_replay, since=self.held)
        check_finite(payload["arrays"], f"checkpoint at gradient step {state.grad_steps}")
        return self.save_slot.offer(payload)

    def _collect_io(self) -> bool:
        """Take in what the writer reported: saves, errors, the replay chunks it holds.
        Returns True if there was news."""
        if self.io is None:
            return False
        results = self.io.results()
        for r in results:
            if "held" in r:
                self.held = r["held"]
            if "saved" in r:
                self.last_save = r["saved"]
                self.saves += 1
                if r["final"]:
                    self.final_save = {"ok": True, **r["saved"]}
            if "error" in r:
                self.save_errors += 1
                self.last_save_error = r["error"]
                self.held = {}  # send every chunk again: the cache may have dropped some
                if r["final"]:
                    self.final_save = {"ok": False, "error": r["error"]}
        return bool(results)

    # --- failure and the end --------------------------------------------------------------------
    def _fail(self, e: BaseException) -> None:
        self.error = f"{type(e).__name__}: {e}"
        self.poisoned = isinstance(e, NonFiniteError)
        log.error("the learner failed; acting continues with the last weights:\n%s", traceback.format_exc())
        append_jsonl(self.spec.metrics_path, {"wall_time": time.time(), "error": self.error})
        self.push_status(self.status())

    def _wait_for_shutdown(self) -> str | None:
        """After a failure: train no more, but wait for Shutdown (or stop) so the close can still
        make the final save; messages in between are counted as lost."""
        while not self.stop.is_set():
            msg = self.inbox.recv(timeout=0.1)
            for m in ([msg] + self.inbox.drain()) if msg is not None else []:
                m = m[1] if isinstance(m, tuple) else m  # (source, message) from a many-bot learner
                if isinstance(m, Shutdown):
                    return m.acting_rng or None
        return None

    def _finish(self, acting_rng: str | None) -> None:
        """The final save (blocking, guaranteed) unless the state is poisoned; stop the writer."""
        s, io = self.state, self.io
        if s is None or io is None:
            self.final_save = {"ok": False, "error": f"the learner never started ({self.error})"}
        elif self.discard:
            self.final_save = {"ok": False, "error": "the bot failed to start; nothing was saved"}
        elif self.poisoned:
            log.error("the learner's state is not finite (%s); no final save: the last good checkpoint "
                      "in %r is kept as it was", self.error, self.spec.weights_dir)
            self.final_save = {"ok": False, "error": "learner state not finite; last good checkpoint kept"}
        else:
            try:
                self._collect_io()
                payload = s.payload(s.cfg.save_replay, since=self.held)
                check_finite(payload["arrays"], "final checkpoint")
                if acting_rng:  # the acting noise, so a resume continues it exactly
                    payload["meta"]["acting_rng"] = acting_rng
                payload["final"] = True
                self.save_slot.put_final(payload, timeout=60.0)
            except Exception as e:  # noqa: BLE001
                self.final_save = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if io is not None:
            if not io.stop(120.0):
                log.error("the I/O thread did not finish in time")
            self._collect_io()
        if self.final_save is None:
            self.final_save = {"ok": False, "error": "the final save was not written"}
        self.push_status(self.status().but(learner_alive=False, closed=True))
