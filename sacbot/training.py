"""The training side: drain experience, then train (SPEC section 3).

The logic is two plain functions of a :class:`TrainingState`, testable without
threads::

    state = TrainingState.fresh(cfg, obs_dim, act_dim)
    for msg in messages:
        handle_message(state, msg)          # into the buffer; opponent policy
    line = train_pass(state, offer_save)    # UTD steps, saves inside the loop

:class:`TrainingThread` is a thin loop around them: block for one message (with a
timeout so the stop event is always seen), take everything else queued, run a pass,
append a metrics line, publish the actor.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .channels import Channel, SaveSlot
from .config import Config
from .messages import NewEpisode, Shutdown, Transition
from .replay import SequenceReplay
from .sac import SACLSTMLearner
from .snapshot import WeightSnapshot


class NonFiniteError(RuntimeError):
    """The learner produced NaN/inf (a loss, a gradient norm or a weight).  Its state is
    poisoned: nothing of it may be published or saved.  The last published weights and the
    last checkpoint stay as they were; the training thread stops."""


def non_finite(arrays: dict[str, np.ndarray]) -> list[str]:
    """Names of the float arrays that hold NaN or inf."""
    return [k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]


def check_finite(arrays: dict[str, np.ndarray], what: str) -> None:
    bad = non_finite(arrays)
    if bad:
        raise NonFiniteError(f"{what}: non-finite values in {', '.join(bad[:5])}"
                             + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


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
    opponent: str | None = None
    pending: int = 0  # transitions handled since the last pass
    buffer_clears: int = 0
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
                "opponent": self.opponent, "learner": lmeta,
                "rng_numpy": json.dumps(self.rng.bit_generator.state)}
        out = {"arrays": arrays, "meta": meta}
        if with_replay:
            out["replay_chunks"], meta["replay"] = self.replay.export_chunks(since)
        return out

    def load_payload(self, arrays: dict, meta: dict) -> None:
        self.learner.load_state(arrays, meta["learner"])
        self.grad_steps, self.env_steps = int(meta["grad_steps"]), int(meta["env_steps"])
        self.episodes, self.utd_carry = int(meta["episodes"]), float(meta["utd_carry"])
        self.passes = int(meta.get("passes", 0))  # older checkpoints did not count them
        self.opponent = meta.get("opponent")
        self.rng.bit_generator.state = json.loads(meta["rng_numpy"])
        if "replay" in meta:
            self.replay.load(arrays, meta["replay"])


def handle_message(state: TrainingState, msg) -> bool:
    """Apply one message.  Returns True for Shutdown."""
    if isinstance(msg, Transition):
        state.replay.add(msg.obs, msg.action, msg.reward, msg.next_obs, msg.terminated, msg.truncated)
        state.env_steps += 1
        state.pending += 1
    elif isinstance(msg, NewEpisode):
        state.replay.start_episode()
        if (state.opponent is not None and msg.opponent != state.opponent
                and state.cfg.opponent_policy == "clear"):
            # Experience against another opponent would mislead the critic (SPEC 2).
            state.replay.clear()
            state.buffer_clears += 1
        state.opponent = msg.opponent
        state.episodes += 1
    elif isinstance(msg, Shutdown):
        return True
    else:
        raise TypeError(f"unknown message {type(msg).__name__}")
    return False


def steps_owed(state: TrainingState) -> int:
    """Gradient steps for the transitions drained: pending x UTD, remainder carried."""
    owed = state.pending * state.cfg.utd_ratio + state.utd_carry
    n = math.floor(owed + 1e-9)
    state.utd_carry = owed - n
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


def train_pass(state: TrainingState, offer_save: Callable[[TrainingState], bool] | None = None,
               stop: threading.Event | None = None) -> dict:
    """Run the gradient steps owed.  Returns the pass's metrics (losses averaged).
    If ``stop`` is set mid-pass, the steps not taken stay owed (carried), so a close is
    prompt and a resumed run still takes them."""
    cfg = state.cfg
    drained = state.pending
    n = steps_owed(state)  # consumes what was drained; the fraction carries
    if not ready_to_learn(state):
        n = 0  # steps owed before learning starts are not made up later
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
        # Inside the loop: a long burst of steps still produces saves (SPEC 3).
        if offer_save is not None and state.grad_steps % cfg.save_interval == 0:
            if not offer_save(state):
                state.save_offers_dropped += 1
    avg = {k: v / done for k, v in sums.items()} if done else {}
    if avg:
        state.losses = avg
    state.passes += 1
    # The original bot's nine fields, with its names and meanings (SPEC 15): existing campaign
    # scripts read them.  sacbot's own fields come after.
    return {"epoch": state.passes, "steps": state.grad_steps, "buffer_size": len(state.replay),
            "drained": drained, "grad_steps": done, **avg, "quant_phase": state.learner.quant_phase}


def append_jsonl(path: str, record: dict) -> bool:
    """Open, append, close.  A failure is reported to the caller, never raised."""
    try:
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        return True
    except (OSError, TypeError, ValueError):
        return False


class TrainingThread(threading.Thread):
    """Owns the learner.  Errors are caught at the top, kept in ``error`` and printed."""

    def __init__(self, state: TrainingState, inbox: Channel, save_slot: SaveSlot,
                 snapshot: WeightSnapshot, metrics_path: str, with_replay: bool = True):
        super().__init__(name="sacbot-training", daemon=True)
        self.state, self.inbox, self.save_slot, self.snapshot = state, inbox, save_slot, snapshot
        self.metrics_path, self.with_replay = metrics_path, with_replay
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.processed = 0  # transitions whose pass has completed (for lockstep pace)
        self._cond = threading.Condition()
        self.metrics_failures = 0
        self.steps_per_s = 0.0
        self.torch_threads = 0
        self.learning = False
        self.poisoned = False  # NonFiniteError: the learner's state must never be saved

    def offer_save(self, state: TrainingState) -> bool:
        # Build the (large) payload only when the writer has room for it.
        if not self.save_slot.has_room():
            return False
        payload = state.payload(self.with_replay, since=self.save_slot.held)
        check_finite(payload["arrays"], f"checkpoint at gradient step {state.grad_steps}")
        return self.save_slot.offer(payload)

    def run(self) -> None:
        try:
            torch.set_num_threads(self.state.cfg.torch_threads)
            self.torch_threads = torch.get_num_threads()  # measured, not configured
            while not self.stop_event.is_set():
                msg = self.inbox.recv(timeout=0.1)
                if msg is None:
                    continue
                msgs = [msg] + self.inbox.drain()
                stop = False
                for m in msgs:
                    stop = handle_message(self.state, m) or stop
                drained = self.state.pending
                if drained:
                    if not self.learning and ready_to_learn(self.state):
                        self.learning = True  # said once: tells a person (or a test) training began
                        print(f"sacbot: learning started with {len(self.state.replay)} transitions "
                              "in the buffer", file=sys.stderr, flush=True)
                    t0 = time.perf_counter()
                    line = train_pass(self.state, self.offer_save, self.stop_event)
                    dt = time.perf_counter() - t0
                    if line["grad_steps"]:
                        self.steps_per_s = line["grad_steps"] / max(dt, 1e-9)
                    actor = self.state.learner.export_actor()
                    check_finite(actor, "actor snapshot")  # acting keeps the last good weights
                    version = self.snapshot.publish(actor)
                    line.update(wall_time=time.time(), policy_version=version,
                                drops=self.inbox.drops,
                                save_drops=self.state.save_offers_dropped)
                    if not append_jsonl(self.metrics_path, line):
                        self.metrics_failures += 1
                    with self._cond:
                        self.processed += drained
                        self._cond.notify_all()
                if stop:
                    break
        except BaseException as e:  # noqa: BLE001 - recorded, printed, reported at exit
            self.error = f"{type(e).__name__}: {e}"
            self.poisoned = isinstance(e, NonFiniteError)
            print(f"sacbot: training thread failed; acting continues with the last weights:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
            append_jsonl(self.metrics_path, {"wall_time": time.time(), "error": self.error})
        finally:
            with self._cond:
                self._cond.notify_all()

    def wait_processed(self, n: int, timeout: float) -> bool:
        """Block until ``n`` transitions have been trained on (lockstep pace).  Returns
        False if the thread died or stopped, so a waiting actor never hangs."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.processed < n:
                if self.error or not self.is_alive() or self.stop_event.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        return True


@dataclass
class IOStats:
    saves: int = 0
    errors: int = 0
    last_save: dict | None = None
    last_error: str | None = None
    final: dict | None = None  # the final save's outcome: {"ok": bool, "path" or "error"}


_SENTINEL = object()


class IOThread(threading.Thread):
    """Writes each offered payload as an atomic checkpoint.  A failed save is counted
    and reported; it never kills the learner, and the next save tries again."""

    def __init__(self, save_slot: SaveSlot, weights_dir: str, keep_last: int, config: dict,
                 spaces: dict):
        super().__init__(name="sacbot-io", daemon=True)
        self.save_slot, self.weights_dir, self.keep_last = save_slot, weights_dir, keep_last
        self.config, self.spaces = config, spaces
        self.stats = IOStats()
        self.stop_event = threading.Event()
        from .checkpoint import ReplayChunkCache
        self.replay_cache = ReplayChunkCache()

    def run(self) -> None:
        from .checkpoint import append_receipt, write_checkpoint

        while True:
            item = self.save_slot.get(timeout=0.2)
            if item is None:
                if self.stop_event.is_set():
                    return
                continue
            try:
                if item is _SENTINEL:
                    return
                try:
                    r = write_checkpoint(self.weights_dir, item, self.keep_last, self.config, self.spaces,
                                         cache=self.replay_cache)
                    # Tell the training thread which replay chunks need not be sent again.
                    self.save_slot.held = self.replay_cache.held()
                    self.stats.saves += 1
                    self.stats.last_save = {"path": r.path, "step": r.step, "bytes": r.bytes,
                                            "time": time.time()}
                    if item.get("final"):
                        self.stats.final = {"ok": True, "path": r.path, "step": r.step}
                    append_receipt(self.weights_dir, {"time": time.time(), "path": r.path, "step": r.step,
                                                      "bytes": r.bytes, "sha256": r.sha256,
                                                      "write_ms": round(r.write_ms, 2)})
                except Exception as e:  # noqa: BLE001 - disk full, permissions: report, go on
                    self.stats.errors += 1
                    self.stats.last_error = f"{type(e).__name__}: {e}"
                    if item.get("final"):
                        self.stats.final = {"ok": False, "error": self.stats.last_error}
                    print(f"sacbot: checkpoint save failed ({self.stats.last_error}); "
                          "the next save will try again", file=sys.stderr, flush=True)
                    append_receipt(self.weights_dir, {"time": time.time(), "error": self.stats.last_error,
                                                      "step": int(item["meta"].get("grad_steps", 0))})
            finally:
                self.save_slot.task_done()

    def stop(self, timeout: float) -> bool:
        """Finish the save in progress, then exit.  Returns True if the thread ended."""
        try:
            self.save_slot.put_final(_SENTINEL, timeout=timeout)
        except Exception:  # noqa: BLE001 - slot still full after timeout: fall back to the event
            self.stop_event.set()
        self.join(timeout)
        return not self.is_alive()
