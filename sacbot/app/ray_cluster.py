"""Many bots, one learner, on Ray (docs/design.md has the picture, docs/guide.md the scale model).

    ray.init(namespace="sacbot")
    learner = start_learner(spec, resources)              # a Ray actor: learner, replay, I/O thread
    bots = [start_bot(cfg, i, root) for i in range(n)]    # Ray actors: an env and the numpy Agent each
    runs = [b.run.remote() for b in bots]                 # each plays until stopped

An external game joins a running cluster by address and feeds the same learner through the
same boundary (tools/join_cluster.py)::

    ray.init(address="auto", namespace="sacbot")
    link = RayLearnerClient(ray.get_actor(LEARNER_NAME), source=SOURCE_ID)
    agent = Agent(cfg, obs_space, action_space, learner=link)

What crosses: bots send msgpack bytes (``messages.encode_batch``) with a small dict of their own
counters; the learner publishes the int8 actor export as msgpack bytes put once per version in
the object store, and a plain status dict.  A bot never waits on the learner: its sender and
puller threads make the calls, at most ``MAX_IN_FLIGHT`` sends are outstanding, and what the
queue cannot hold is dropped and counted, as with a local learner.

Faults use Ray's own machinery: the learner actor has ``max_restarts``/``max_task_retries``, and a
restarted learner resumes from the newest checkpoint in its weights directory; a bot actor is
restarted the same way, and its in-flight ``run`` is retried, so it plays on from its round counter.
Bots keep acting on their last weights while the learner is away.

Nothing in this module imports Ray or torch at import time: ``require_ray()`` says which extra is
missing, and the learner actor imports torch in its own process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from sacbot.config import Config, ConfigError
from sacbot.wire.boundary import LearnerLink, LearnerSpec
from sacbot.wire.channels import transitions_in
from sacbot.wire.messages import (
    MAX_ABS_OBS,
    MAX_ABS_REWARD,
    MessageError,
    Transition,
    Transitions,
    decode_batch,
    encode_batch,
    pack,
    unpack,
)

log = logging.getLogger("sacbot")
NAMESPACE = "sacbot"
LEARNER_NAME = "sacbot-learner"
MAX_IN_FLIGHT = 4  # sends outstanding per bot; more and the bot's queue fills and drops
# A bot sends once SEND_BATCH messages wait or the oldest has waited SEND_PERIOD_S.  A call costs
# the learner ~0.65 ms of CPU whatever it carries (Ray's part: decoding and storing 64 transitions
# is ~65 us), so the calls, not the bytes, set what one learner can ingest.  Measured side by side
# (BENCHMARKS.md, "Learner ingest"), 20k transitions/s left training at 0.68x its speed alone in
# calls of 64, 0.84x in calls of 150 and 0.96x in calls of 256 (0.21x in calls of 16).  So a bot at
# 30 ticks/s waits 8 s and sends ~240 per call: 600 such bots make ~80 calls/s.  An off-policy
# learner loses nothing by seeing experience 8 s later; a bot killed with kill -9 loses up to 8 s of
# it (its outbox), as it loses its whole queue.  A faster bot fills SEND_BATCH sooner.
SEND_BATCH = 256
SEND_PERIOD_S = 8.0
PULL_PERIOD_S = 0.05  # a bot asks for a newer actor at most 20 times a second
STATUS_PERIOD_S = 1.0
WAITING_STATUS_PERIOD_S = 0.1  # while a bot waits for the learner (the learner pace)
CALL_TIMEOUT_S = 10.0


def require_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("sacbot cluster needs Ray, an optional extra: pip install 'sacbot[ray]'") from None
    return ray


# --- the learner actor ------------------------------------------------------------------------
class InOrder:
    """Puts one sender's numbered batches back in order.  At most ``window`` calls are in flight
    per sender, so more than ``window`` batches waiting behind a gap means the gap's batch was lost
    (its call failed): it is skipped, counted in ``lost``.  The first call seen starts the count at
    ``floor``, the oldest number its sender still had in flight (a restarted learner meets a
    sender mid-stream); a number already passed is a retried duplicate and is dropped.
    ``seq=None`` delivers at once (an unnumbered sender)."""

    def __init__(self, window: int, client: str | None = None):
        self.window, self.client, self.next, self.held, self.lost = window, client, None, {}, 0

    def put(self, seq: int | None, floor: int | None, batch) -> list:
        if seq is None:
            return [batch]
        if self.next is None:
            self.next = seq if floor is None else floor
        if seq < self.next:
            return []
        self.held[seq] = batch
        out = []
        while True:
            if self.next in self.held:
                out.append(self.held.pop(self.next))
                self.next += 1
            elif len(self.held) > self.window:
                gap_end = min(self.held)
                self.lost += gap_end - self.next
                self.next = gap_end
            else:
                return out



class LearnerServer:
    """The body of the Ray learner actor (wrapped with ``ray.remote`` by :func:`learner_actor`).

    It owns a :class:`sacbot.learning.training.LearnerLoop` on a thread of its own process, fed from a
    bounded queue of ``(source, message)``.  Built from plain data; on a restart after a crash
    Ray calls ``__init__`` again and the learner resumes from the newest checkpoint."""

    def __init__(self, spec: LearnerSpec, queue_size: int):
        logging.basicConfig(format="sacbot: %(message)s", level=logging.INFO)
        from sacbot.learning.training import LearnerLoop
        from sacbot.store.load import load_latest
        from sacbot.store.lock import WriterLock
        from sacbot.store.weights_dir import remove_stale_temps
        from sacbot.wire.channels import Channel

        self.spec, cfg = spec, spec.cfg()
        os.makedirs(spec.weights_dir, exist_ok=True)
        self.lock = WriterLock(spec.weights_dir).acquire_within(30.0)  # a killed learner's may linger
        remove_stale_temps(spec.weights_dir)
        from sacbot.assembly.assemble import expect_for

        found = load_latest(spec.weights_dir, expect_for(cfg, spec.obs_dim, spec.act_dim, spec.spaces),
                               log=lambda m: log.info(m.removeprefix("sacbot: ")), latest_name=spec.latest_name)
        self.loaded_from = found[1] if found else None
        self.inbox = Channel(queue_size)
        # Versions continue across a restart from the checkpoint's step, so they only go up.
        base = int(found[0]["manifest"].get("step", 0)) if found else 0
        self._snap: tuple[int, bytes] = (base, b"")
        self._snap_ref = None
        self._status: dict = {}
        self._bots: dict[int, dict] = {}
        self._order: dict[int, InOrder] = {}
        self._refused = 0  # batches refused
        self._received = 0
        self._dropped_here = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.loop = LearnerLoop(spec, found[0] if found else None, self.inbox, self._publish, self._push,
                                self._stop)
        self.samples_per_step = cfg.batch_size * cfg.seq_len
        self.started = time.time()
        self._thread = threading.Thread(target=self.loop.run, name="sacbot-training", daemon=True)
        self._thread.start()
        self._ready.wait(300.0)

    def _publish(self, arrays: dict) -> int:
        blob = pack(arrays)  # the int8 export, as msgpack bytes
        with self._lock:
            version = self._snap[0] + 1
            self._snap, self._snap_ref = (version, blob), None
        return version

    def _push(self, status: dict) -> None:
        with self._lock:
            self._status = {**self._status, **status}
        self._ready.set()  # the first push follows the build (its first actor) or its failure

    # --- the boundary, as Ray methods -------------------------------------------------------
    def send(self, source: int, data: bytes, info: dict | None = None, seq: tuple | None = None) -> int:
        """Take a batch from bot ``source``; ``info`` is the bot's own counters (policy version,
        drops, ticks); ``seq`` is (this batch's number, the oldest number the bot still has in
        flight, the sending client's id).  Returns the newest published version.

        This actor runs several calls at once (pulls and status must not wait behind sends), so
        Ray does not keep one bot's calls in order: the batches are put back in ``seq`` order
        before their messages reach the learner (an episode's start before its transitions)."""
        try:
            msgs = decode_batch(data)
        except MessageError as e:
            log.error("bot %s sent an undecodable batch: %s", source, e)
            with self._lock:
                self._refused += 1
            return self._snap[0]
        bad = self._refuse(source, msgs)
        if bad:  # one careless client must not stop (or poison) the learner every bot shares
            log.error("bot %s: batch refused: %s", source, bad)
            with self._lock:
                self._refused += 1
            return self._snap[0]
        source = int(source)
        number, floor, client = (seq if seq is not None else (None, None, None))
        with self._lock:
            if info is not None:
                self._bots[source] = {**info, "time": time.time()}
            order = self._order.get(source)
            if order is None or order.client != client:  # a new (or restarted) bot on this source
                order = self._order[source] = InOrder(MAX_IN_FLIGHT, client)
            ready = order.put(number, floor, msgs)
            for batch in ready:  # under the lock: two calls never interleave their batches
                for m in batch:
                    n = transitions_in(m)
                    if self.inbox.send((source, m)):
                        self._received += n
                    else:
                        self._dropped_here += n
        return self._snap[0]

    def _refuse(self, source, msgs) -> str | None:
        """Why a bot's batch cannot go in, or None: a source id out of range, a Shutdown (only the
        cluster closes the learner), arrays of another bot's spaces, non-finite values."""
        import numpy as np

        from sacbot.wire.messages import Shutdown

        if not isinstance(source, int) or not 0 <= source < 2**31:
            return f"source {source!r} is not an integer in [0, 2**31)"
        d, a = self.spec.obs_dim, self.spec.act_dim
        for m in msgs:
            if isinstance(m, Shutdown):
                return "a Shutdown: bots stop by closing their own link; the cluster closes the learner"
            if isinstance(m, Transition | Transitions):
                lead = (len(m),) if isinstance(m, Transitions) else ()
                if m.obs.shape != (*lead, d) or m.next_obs.shape != (*lead, d) or m.action.shape != (*lead, a):
                    return (f"transition shapes {m.obs.shape[len(lead):]}/{m.action.shape[len(lead):]}, the "
                            f"learner's spaces are ({d},)/({a},)")
                if not (np.isfinite(m.obs).all() and np.isfinite(m.next_obs).all() and np.isfinite(m.action).all()
                        and np.isfinite(m.reward).all() and (np.abs(m.reward) <= MAX_ABS_REWARD).all()
                        and (np.abs(m.obs) <= MAX_ABS_OBS).all() and (np.abs(m.next_obs) <= MAX_ABS_OBS).all()):
                    return (f"non-finite values, or a reward above {MAX_ABS_REWARD:.0e} or an observation value "
                            f"above {MAX_ABS_OBS:.0e} in size")
        return None

    def spaces(self) -> tuple[int, int]:
        """(obs_dim, act_dim) the learner trains on: a joining bot checks its own against them."""
        return self.spec.obs_dim, self.spec.act_dim

    def pull(self, version: int):
        """``(version, ObjectRef of the export bytes)`` when newer than ``version``, else None.
        The bytes go into the object store once per version, however many bots pull them."""
        import ray

        with self._lock:
            v, blob = self._snap
            if v == version or not blob:
                return None
            if self._snap_ref is None:
                self._snap_ref = ray.put(blob)
            return v, self._snap_ref

    def status(self) -> dict:
        with self._lock:
            st, bots, version = dict(self._status), dict(self._bots), self._snap[0]
        steps, env_steps = st.get("learner_steps", 0), st.get("env_steps_received", 0)
        cfg = self.spec.config
        replay_ratio = steps * self.samples_per_step / env_steps if env_steps else 0.0
        target = cfg["utd_ratio"] * self.samples_per_step
        bot_drops = sum(int(b.get("drops", {}).get("transition", 0)) for b in bots.values())
        st.update(
            loaded_from=self.loaded_from, policy_version=version,
            replay_ratio=round(replay_ratio, 2), replay_ratio_target=round(target, 2),
            capacity_samples_per_s=round(st.get("grad_steps_per_s", 0.0) * self.samples_per_step, 1),
            transitions_received=self._received, dropped_at_learner=self._dropped_here,
            refused_at_learner=self._refused,
            lost_out_of_order=sum(o.lost for o in self._order.values()),
            dropped_at_bots=bot_drops, inbox=self.inbox_size(), inbox_capacity=self.inbox.capacity,
            bots={str(k): {"policy_lag": version - int(b.get("policy_version", 0)),
                           "ticks": b.get("ticks"), "episodes": b.get("episodes"),
                           "seen_s_ago": round(time.time() - b["time"], 1)} for k, b in bots.items()})
        # The bots outrun the learner when experience is lost on the way in, or waits in a queue
        # that keeps the learner busy full time: then say so rather than fall behind silently.
        st["outrun"] = bool(self._dropped_here or bot_drops or st["inbox"] > self.inbox.capacity // 2)
        return st

    def inbox_size(self) -> int:
        return len(self.inbox)

    def close(self, timeout: float = 120.0) -> dict:
        """Shutdown after the data: the final save, then the writer stops.  Returns the status."""
        from sacbot.wire.messages import Shutdown

        self.inbox.send((0, Shutdown("")), control_wait=timeout)
        self._thread.join(timeout)
        self.lock.close()
        return self.status()

    def sample_sources(self, n: int = 256) -> list[list[int]]:
        """For tests: the sources of every valid step of ``n`` windows sampled as training does."""
        import numpy as np

        state = self.loop.state
        if state is None or not hasattr(state.replay, "source"):
            return []
        cfg = state.cfg
        rng = np.random.default_rng(0)
        out = []
        for _ in range(max(1, n // cfg.batch_size)):
            idx = state.replay.sample_indices(cfg.batch_size, cfg.seq_len, rng, cfg.burn_in)
            out += [sorted({int(state.replay.source[i]) for i in row if i >= 0}) for row in idx]
        return out

    def pid(self) -> int:
        return os.getpid()


INGEST_GROUP = "ingest"  # the concurrency group of ``send``: see learner_actor


def learner_actor(spec: LearnerSpec, queue_size: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  cls: type | None = None):
    """Start (or find, by name) the cluster's learner actor (``cls``: LearnerServer or a subclass).

    Restarts are Ray's (``max_restarts``, retried calls).  ``send`` runs in a concurrency group of
    its own with one thread, however a client calls it: batches are decoded and stored one at a
    time, so ingest takes at most one thread's turns at the GIL from the training thread, however
    many bots send; pulls and status calls run in the default group meanwhile and never wait
    behind a send."""
    ray = require_ray()
    base = cls or LearnerServer

    class Grouped(base):  # type: ignore[misc, valid-type]
        @ray.method(concurrency_group=INGEST_GROUP)
        def send(self, *args, **kwargs):
            return super().send(*args, **kwargs)

    Grouped.__name__ = Grouped.__qualname__ = base.__name__  # Ray names the worker process by it
    actor_cls = ray.remote(concurrency_groups={INGEST_GROUP: 1})(Grouped)
    return actor_cls.options(name=LEARNER_NAME, namespace=NAMESPACE, get_if_exists=True, max_restarts=-1,
                             max_task_retries=-1, num_cpus=num_cpus, num_gpus=num_gpus,
                             max_concurrency=3).remote(spec, queue_size)


# --- a bot's handle on the learner --------------------------------------------------------------
class RayLearnerClient(LearnerLink):
    """The learner boundary of a bot whose learner is the cluster's Ray actor.  ``send`` never
    blocks: a sender thread ships batches with at most ``MAX_IN_FLIGHT`` calls outstanding, and
    a puller thread fetches newer actors; when the learner is away (restarting), the bot acts on
    its last weights and what it cannot send is dropped and counted."""

    def __init__(self, learner, source: int, queue_size: int = 256):
        super().__init__(queue_size)
        self.learner, self.source = learner, int(source)
        self._stop = threading.Event()
        self.acting_version = 0  # the actor version the bot plays (its policy lag is measured from it)
        self._seq = 0  # numbers this bot's batches, so the learner can keep them in order
        # A restarted bot numbers from 1 again: the learner tells the new client by this id.
        self.client = uuid.uuid4().hex
        self.lost_in_flight = 0
        # What is on its way to the learner, for the learner pace: the batch being filled and the
        # transitions of calls not yet answered (the outbox's own length is read directly).
        self._batching = 0
        self._in_flight_n = 0
        self._waiting = threading.Event()  # a bot waits for the learner: ship now, ask status often
        self._threads = [threading.Thread(target=self._send_loop, name="sacbot-sender", daemon=True),
                         threading.Thread(target=self._pull_loop, name="sacbot-puller", daemon=True)]
        for t in self._threads:
            t.start()

    def _send_loop(self) -> None:
        ray = require_ray()
        in_flight: list = []
        seq_of: dict = {}  # in-flight call -> its batch number; the oldest tells the learner where we are
        count_of: dict = {}  # in-flight call -> the messages it carries

        def settle(done: list) -> None:
            for ref in done:
                seq_of.pop(ref, None)
                self._in_flight_n -= count_of.pop(ref, 0)
            self._settle(ray, done)

        while True:
            if in_flight:  # answered calls leave at once: the learner pace counts what is still out
                done, in_flight = ray.wait(in_flight, num_returns=len(in_flight), timeout=0)
                settle(done)
            # Read before the outbox: whatever the bot put before closing is then in the drain
            # below, and goes in one last call instead of staying behind.
            closing = self._stop.is_set()
            msg = None if closing else self.outbox.recv(timeout=0.1)
            batch = ([] if msg is None else [msg]) + self.outbox.drain()
            if not batch:
                if closing:
                    break
                continue
            deadline = time.monotonic() + SEND_PERIOD_S
            # Up to about twice the bot's own queue size (the last drain takes what waits): the
            # learner's inbox is sized from it (4 queues or more), so a batch always fits there.
            # A bot that waits for the learner sends what it has: the rest of a batch would never come.
            while (len(batch) < min(SEND_BATCH, self.outbox.capacity) and not self._stop.is_set()
                   and not self._waiting.is_set()):
                self._batching = len(batch)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                more = self.outbox.recv(timeout=min(left, 0.1))  # a close is seen within 0.1 s
                if more is not None:
                    batch += [more] + self.outbox.drain()
            self._batching = len(batch)
            while len(in_flight) >= MAX_IN_FLIGHT and not self._stop.is_set():
                done, in_flight = ray.wait(in_flight, num_returns=1, timeout=1.0)
                settle(done)
            info = {"policy_version": self.acting_version, "drops": self.outbox.drops,
                    "lost_in_flight": self.lost_in_flight}
            self._seq += 1
            seq = (self._seq, min([self._seq, *seq_of.values()]), self.client)
            seq_of[(ref := self.learner.send.remote(self.source, encode_batch(batch), info, seq))] = self._seq
            count_of[ref] = len(batch)
            self._in_flight_n += len(batch)
            self._batching = 0
            in_flight.append(ref)
            if closing:
                break  # one last drain, even if something still sends after the close
        if in_flight:  # what is still on its way gets a moment to land
            done, _ = ray.wait(in_flight, num_returns=len(in_flight), timeout=5.0)
            self._settle(ray, done)

    def _settle(self, ray, done: list) -> None:
        for ref in done:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - the learner died mid-call: that batch is lost
                self.lost_in_flight += 1

    def _pull_loop(self) -> None:
        ray = require_ray()
        version, last_status = 0, 0.0
        while not self._stop.wait(PULL_PERIOD_S):
            try:
                got = ray.get(self.learner.pull.remote(version), timeout=CALL_TIMEOUT_S)
                if got is not None:
                    version = got[0]
                    self.publish(unpack(ray.get(got[1], timeout=CALL_TIMEOUT_S)), version)
                period = WAITING_STATUS_PERIOD_S if self._waiting.is_set() else STATUS_PERIOD_S
                if time.monotonic() - last_status > period:
                    last_status = time.monotonic()
                    st = ray.get(self.learner.status.remote(), timeout=CALL_TIMEOUT_S)
                    st.pop("bots", None)
                    self.push_status(st)  # the learner's own word on whether it is alive
            except Exception as e:  # noqa: BLE001 - away or restarting: act on, say so, retry
                self.push_status({"learner_alive": False, "learner_error": None,
                                  "last_error": f"learner unreachable: {type(e).__name__}"})

    def wait_ready(self, timeout: float, stop=None) -> bool:
        # Not the link's: "not alive" here means unreachable for now (restarting), not failed.
        return self.wait_for(lambda st: self.snapshot.version > 0, timeout, stop)

    def spaces(self) -> tuple[int, int]:
        ray = require_ray()
        return tuple(ray.get(self.learner.spaces.remote(), timeout=CALL_TIMEOUT_S))

    def pull(self, version: int):
        got = super().pull(version)
        if got is not None:
            self.acting_version = got[0]
        return got

    def wait_processed(self, n: int, timeout: float, stop=None) -> bool:
        return False  # lockstep needs a learner of one's own; the cluster refuses it up front

    def wait_caught_up(self, sent: int, slack: int, timeout: float, stop=None) -> bool:
        """The learner pace on a shared learner, Ape-X's replay-ratio control made per bot: wait
        while this bot has more than ``slack`` messages on their way (queued, batched, in
        flight) or the learner has more than half its inbox waiting for updates.  A learner that
        is away (restarting) is not waited for: the bot plays on and counts its drops."""
        def caught_up(st: dict) -> bool:
            if not st.get("learner_alive", True):
                return True
            backlog = int(st.get("transitions_received", 0)) - int(st.get("processed", 0))
            on_the_way = len(self.outbox) + self._batching + self._in_flight_n
            return on_the_way <= slack and backlog <= int(st.get("inbox_capacity", 1 << 62)) // 2

        if caught_up(self._status):
            return True
        self._waiting.set()
        try:
            # Polled (the local counts change without a status push): a stop event that is never
            # set gives wait_for its poll interval when the caller has none.
            ok = self.wait_for(caught_up, timeout, stop if stop is not None else threading.Event())
        finally:
            self._waiting.clear()
        return ok and bool(self._status.get("learner_alive", True))

    def close(self, acting_rng: str | None = None, timeout: float = 30.0) -> dict:
        """Stops this bot's link only: the shared learner goes on and makes its own final save."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        return {**self.status(), "final_save": {"ok": True, "by": "the cluster's learner"}}


# --- a bot actor --------------------------------------------------------------------------------
class BotServer:
    """The body of a Ray bot actor: a gymnasium env and the numpy Agent, feeding the learner."""

    def __init__(self, cfg: Config, index: int):
        logging.basicConfig(format=f"sacbot bot{index}: %(message)s", level=logging.WARNING)
        self.cfg, self.index = cfg, index
        self.stop = threading.Event()

    def run(self) -> dict:
        """Play until stopped (or --steps/--episodes).  Retried by Ray after a restart."""
        from sacbot.app.driver import drive, dropped_share

        ray = require_ray()
        learner = None
        if not self.cfg.eval_mode:
            learner = RayLearnerClient(ray.get_actor(LEARNER_NAME, namespace=NAMESPACE), self.index,
                                       self.cfg.queue_size)
        report = drive(self.cfg, self.stop, learner=learner)
        agent = report.pop("agent")
        return {"bot": self.index, "episodes": agent.episodes, "env_steps": report["env_steps"],
                "dropped": dropped_share(agent)[0] + (learner.lost_in_flight if learner is not None else 0),
                "results": {k: list(map(float, v)) for k, v in agent.results.items()},
                "wins": {k: list(map(bool, v)) for k, v in agent.wins.items()}}

    def request_stop(self) -> None:
        self.stop.set()

    def pid(self) -> int:
        return os.getpid()


def bot_actor(cfg: Config, index: int, num_cpus: float = 1.0):
    ray = require_ray()
    cls = ray.remote(BotServer)
    return cls.options(name=f"sacbot-bot{index}", namespace=NAMESPACE, max_restarts=-1, max_task_retries=-1,
                       num_cpus=num_cpus, max_concurrency=2).remote(cfg, index)
