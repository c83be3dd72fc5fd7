"""A bot's handle on the cluster's Ray learner: :class:`RayLearnerClient`, the learner boundary
over Ray calls (sacbot/app/ray_cluster.py has the learner actor and the bot actors).

    link = RayLearnerClient(ray.get_actor("sacbot-learner", namespace="sacbot"), source=7)
    agent = Agent(cfg, obs_space, action_space, learner=link)

The bot's ``act`` never waits on the learner: its sender and puller threads make the calls, at
most ``MAX_IN_FLIGHT`` sends are outstanding, and what the queue cannot hold is dropped and
counted, as with a local learner.  Only the ``learner`` pace waits, between ticks, in the driver
(:meth:`RayLearnerClient.wait_caught_up`).  Ray is imported when first used (``require_ray``).
"""

from __future__ import annotations

import threading
import time
import uuid

from sacbot.config import ConfigError
from sacbot.wire.boundary import LearnerLink
from sacbot.wire.messages import encode_batch, unpack
from sacbot.wire.status import LearnerStatus

NAMESPACE = "sacbot"
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
        def caught_up(st: LearnerStatus) -> bool:
            if not st.learner_alive:
                return True
            # The cluster's learner adds its ingest figures to the record (LearnerStatus.extra).
            backlog = int(st.extra.get("transitions_received", 0)) - st.processed
            on_the_way = len(self.outbox) + self._batching + self._in_flight_n
            return on_the_way <= slack and backlog <= int(st.extra.get("inbox_capacity", 1 << 62)) // 2

        if caught_up(self._status):
            return True
        self._waiting.set()
        try:
            # Polled (the local counts change without a status push): a stop event that is never
            # set gives wait_for its poll interval when the caller has none.
            ok = self.wait_for(caught_up, timeout, stop if stop is not None else threading.Event())
        finally:
            self._waiting.clear()
        return ok and self._status.learner_alive

    def close(self, acting_rng: str | None = None, timeout: float = 30.0) -> LearnerStatus:
        """Stops this bot's link only: the shared learner goes on and makes its own final save."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        return self.status().but(final_save={"ok": True, "by": "the cluster's learner"})
