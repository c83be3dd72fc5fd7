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
the object store, and a plain status dict.  A bot's handle on the learner is
``sacbot/app/ray_client.py``.

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

from sacbot.app.ray_client import MAX_IN_FLIGHT, NAMESPACE, RayLearnerClient, require_ray
from sacbot.config import Config
from sacbot.wire.boundary import LearnerSpec
from sacbot.wire.channels import Chain, transitions_in
from sacbot.wire.messages import (
    MAX_ABS_OBS,
    MAX_ABS_REWARD,
    MessageError,
    NewEpisode,
    Transition,
    Transitions,
    decode_batch,
    pack,
)
from sacbot.wire.status import LearnerStatus

log = logging.getLogger("sacbot")
LEARNER_NAME = "sacbot-learner"
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
                               logger=log, latest_name=spec.latest_name)
        self.loaded_from = found[1] if found else None
        self.inbox = Channel(queue_size)
        # Versions continue across a restart from the checkpoint's step, so they only go up.
        base = int(found[0]["manifest"].get("step", 0)) if found else 0
        self._snap: tuple[int, bytes] = (base, b"")
        self._snap_ref = None
        self._status = LearnerStatus()
        self._bots: dict[int, dict] = {}
        self._order: dict[int, InOrder] = {}
        self._refused = 0  # batches refused
        self._received = 0
        self._dropped_here = 0
        self._chains: dict[int, Chain] = {}  # each bot's replay chain across this inbox's drops
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

    def _push(self, status: LearnerStatus) -> None:
        with self._lock:
            self._status = status
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
                # A learner restarted from its checkpoint holds the bot's chain as saved, and what came
                # after it is lost: a bot met mid-episode goes on in a new chain (its own start clears this).
                self._chain(source).lost()
            lost = order.lost
            ready = order.put(number, floor, msgs)
            if order.lost > lost:
                self._chain(source).lost()  # a lost batch is a gap in its episode too
            for batch in ready:  # under the lock: two calls never interleave their batches
                for m in batch:
                    self._deliver(source, m)
        return self._snap[0]

    def _chain(self, source: int) -> Chain:
        chain = self._chains.get(source)
        if chain is None:
            chain = self._chains[source] = Chain(NewEpisode("", gap=True))
        return chain

    def _deliver(self, source: int, m) -> None:
        """Queue one of a bot's messages for the learner (under the lock).  After transitions of the
        bot's were dropped here, its next one goes after a gap marker (sacbot.wire.channels.Chain),
        or is dropped too: chained to the one before the gap, a sampled sequence would step over it."""
        if isinstance(m, NewEpisode):
            if self.inbox.send((source, m)):
                self._chains.pop(source, None)  # a new chain: _chain makes it at the next transition
            else:
                self._chain(source).lost()  # a lost episode start must not chain two episodes either
            return
        n = transitions_in(m)
        if self._chain(source).send(lambda x: self.inbox.send((source, x)), m):
            self._received += n
        else:
            self._dropped_here += n

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
            st, bots, version = self._status.to_dict(), dict(self._bots), self._snap[0]
        steps, env_steps = st["learner_steps"], st["env_steps_received"]
        cfg = self.spec.config
        replay_ratio = steps * self.samples_per_step / env_steps if env_steps else 0.0
        target = cfg["utd_ratio"] * self.samples_per_step
        bot_drops = sum(int(b.get("drops", {}).get("transition", 0)) for b in bots.values())
        st.update(
            loaded_from=self.loaded_from, policy_version=version,
            replay_ratio=round(replay_ratio, 2), replay_ratio_target=round(target, 2),
            capacity_samples_per_s=round(st["grad_steps_per_s"] * self.samples_per_step, 1),
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
