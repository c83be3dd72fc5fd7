"""The wire: messages and their msgpack form, bounded channels, the weight snapshot."""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
import pytest

from sacbot.wire.channels import Channel, SaveSlot
from sacbot.wire.messages import MessageError, NewEpisode, Shutdown, Transition, decode, encode, make_transition, pack
from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot

pytestmark = pytest.mark.timeout(60)



def tr(i=0.0, term=False, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], term, trunc, obs_dim=3, act_dim=1)


def test_every_message_round_trips_through_msgpack():
    for msg in (tr(1.5, term=True), NewEpisode("tracker"), NewEpisode(""), NewEpisode("x", gap=True), Shutdown()):
        back = decode(encode(msg))
        assert type(back) is type(msg) and back == msg
    # A peer from before gap markers sends an episode start as two fields; a third must be a bool.
    assert decode(pack(["N", "x"])) == NewEpisode("x") and encode(NewEpisode("x")) == pack(["N", "x"])
    with pytest.raises(MessageError):
        decode(pack(["N", "x", 1]))
    t = decode(encode(tr(2.0)))
    assert isinstance(t, Transition) and t.obs.dtype == np.float32 and t.obs[0] == 2.0


def test_a_batch_carries_each_run_of_transitions_as_one_block_of_columns():
    """What a process or Ray learner receives: runs between control messages become Transitions
    blocks whose rows are the transitions sent, exactly (rewards as the float64 they were)."""
    from sacbot.wire.messages import Transitions, decode_batch, encode_batch

    run1 = [tr(i, trunc=i == 2) for i in range(3)]
    run2 = [make_transition([i, 1, 2], [-0.25], 0.1 + i, [3, i, 1], i == 1, False, obs_dim=3, act_dim=1)
            for i in range(2)]
    got = decode_batch(encode_batch([NewEpisode("a"), *run1, NewEpisode("b"), *run2, Shutdown("s")]))
    assert [type(m).__name__ for m in got] == ["NewEpisode", "Transitions", "NewEpisode", "Transitions", "Shutdown"]
    assert got[1].rows() == run1 and got[3].rows() == run2 and len(got[1]) == 3
    assert got[3].reward.tolist() == [0.1, 1.1] and got[0] == NewEpisode("a") and got[4] == Shutdown("s")
    block = Transitions.of(run1)
    for bad in (dataclasses.replace(block, reward=block.reward[:2]),  # columns of different lengths
                dataclasses.replace(block, obs=block.obs.astype(np.float64)),  # not float32
                dataclasses.replace(block, terminated=block.terminated.astype(np.int8))):
        with pytest.raises(MessageError, match="block"):
            decode_batch(encode_batch([bad]))


def test_the_process_learners_pipe_keeps_each_bots_source_on_its_rows():
    """A shared learner in a process (sacbot serve --shared-learner --learner process) gets
    (source, message) pairs: each run of one source crosses as one tagged batch, in order; a bot's
    own learner gets plain messages, as before."""
    from sacbot.learning.process_learner import decode_run, encode_runs
    from sacbot.wire.messages import pack

    sent = [(0, NewEpisode("a")), (0, tr(1)), (0, tr(2)), (3, NewEpisode("b")), (3, tr(7)), (0, tr(3)), Shutdown("s")]
    pipe = encode_runs(sent)
    assert len(pipe) == 4  # runs: source 0, source 3, source 0, and the plain Shutdown
    got = [item for data in pipe for item in decode_run(data)]
    assert [(s, type(m).__name__) for s, m in got[:-1]] == [(0, "NewEpisode"), (0, "Transitions"), (3, "NewEpisode"),
                                                             (3, "Transitions"), (0, "Transitions")]
    assert got[1][1].rows() == [tr(1), tr(2)] and got[3][1].rows() == [tr(7)] and got[-1] == Shutdown("s")
    assert decode_run(encode_runs([NewEpisode("x"), tr(5)])[0])[1].rows() == [tr(5)]  # one bot: no tags
    for bad in ({"source": -1, "batch": b""}, {"source": "0", "batch": b""}, {"source": 1, "batch": [1]}):
        with pytest.raises(MessageError, match="sourced batch"):
            decode_run(pack(bad))


def test_a_block_counts_as_its_length_in_a_channel_and_goes_in_whole():
    from sacbot.wire.messages import Transitions

    ch = Channel(capacity=5)
    assert ch.send((0, Transitions.of([tr(i) for i in range(3)])))
    assert not ch.send((1, Transitions.of([tr(i) for i in range(3)])))  # 3 + 3 > 5: all of it dropped
    assert ch.send(tr(9)) and ch.send(NewEpisode("x")) and len(ch) == 4
    assert ch.drops == {"transition": 3, "other": 0}
    assert len(ch.drain()) == 3 and len(ch) == 0
    assert ch.send((1, Transitions.of([tr(i) for i in range(5)])))
    assert not ch.send(Transitions.of([tr(i) for i in range(7)]))  # larger than the capacity: not while 5 wait
    ch.drain()
    assert ch.send(Transitions.of([tr(i) for i in range(7)])) and len(ch) == 7  # but into an empty channel


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02", encode(tr())[:-3],
                                  encode(NewEpisode("x")).replace(b"N", b"Q"), b"\xd4\x05\x00"])
def test_malformed_bytes_give_a_clear_error(data):
    with pytest.raises(MessageError, match="malformed|unknown"):
        decode(data)


@pytest.mark.parametrize("kw,match", [(dict(obs=[0, 0]), "shape"), (dict(obs=[0, np.nan, 0]), "non-finite"),
                                      (dict(reward=float("inf")), "reward"), (dict(action=[[1.0]]), "shape")])
def test_bad_transitions_are_refused_at_the_boundary(kw, match):
    args = dict(obs=[0, 0, 0], action=[0.5], reward=0.0, next_obs=[0, 0, 0], terminated=False, truncated=False)
    args.update(kw)
    with pytest.raises(MessageError, match=match):
        make_transition(**args, obs_dim=3, act_dim=1)


def test_overflow_drops_newest_transitions_and_counts_exactly():
    ch = Channel(capacity=5)
    sent = [tr(i) for i in range(8)]
    accepted = [ch.send(m) for m in sent]
    assert accepted == [True] * 5 + [False] * 3
    assert ch.drops == {"transition": 3, "other": 0}
    kept = ch.drain()
    assert [m.obs[0] for m in kept] == [0, 1, 2, 3, 4]  # the oldest are kept, in order
    assert ch.recv(timeout=0.01) is None


@pytest.mark.timeout(30)
def test_episode_starts_are_never_dropped_by_a_full_queue():
    """A NewEpisode lost to a full queue chained two episodes in the replay and could skip an
    opponent change's clear: control messages have reserved places."""
    ch = Channel(capacity=5, reserve=2)
    for i in range(5):
        assert ch.send(tr(i))
    assert not ch.send(tr(5))
    assert ch.send(NewEpisode("a")) and ch.send(NewEpisode("b"))
    assert not ch.send(tr(6))  # the reserve is for control messages only
    assert ch.drops == {"transition": 2, "other": 0}
    # With the reserve full too, a control message waits (bounded) and is counted, never lost
    # silently.
    assert not ch.send(NewEpisode("c"), control_wait=0.01) and ch.drops["other"] == 1
    got = ch.drain()
    assert [type(m).__name__ for m in got] == ["Transition"] * 5 + ["NewEpisode"] * 2


@pytest.mark.timeout(30)
def test_gap_markers_take_the_transitions_places_not_the_episode_starts_reserve():
    """Many bots sharing one queue each send a gap marker after their drops: in the reserve they
    would crowd out the episode starts it is kept for."""
    ch = Channel(capacity=3, reserve=2)
    assert ch.send(tr(0)) and ch.send(NewEpisode("x", gap=True)) and len(ch) == 2
    assert ch.send(tr(1)) and not ch.send(tr(2))  # the marker took a place of the capacity
    assert not any(ch.send(("bot", NewEpisode("", gap=True))) for _ in range(10))  # full: refused
    assert ch.drops == {"transition": 1, "other": 0}  # a marker holds no data: its transition is counted
    assert ch.send(NewEpisode("a")) and ch.send(NewEpisode("b"))  # the reserve is whole
    assert [type(m).__name__ for m in ch.drain()] == ["Transition", "NewEpisode", "Transition"] + ["NewEpisode"] * 2
    assert len(ch) == 0 and ch.send(NewEpisode("y", gap=True)) and len(ch) == 1


def test_save_slot_drops_offers_but_never_the_final_save():
    slot = SaveSlot()
    assert slot.offer("a") and not slot.offer("b")
    got = []

    def consume():  # long waits: the final put must not lose a race with a stalled thread
        got.append(slot.get(10.0))
        slot.task_done()
        got.append(slot.get(10.0))
        slot.task_done()

    t = threading.Thread(target=consume, name="test-consumer")
    t.start()
    slot.put_final("final", timeout=5)
    t.join(5)
    assert got == ["a", "final"]


def test_publish_increments_version_and_pull_reports_change():
    snap = WeightSnapshot()
    reader = SnapshotReader(snap)
    assert not reader.pull()
    snap.publish({"w": np.ones(3, np.float32)})
    assert reader.pull() and reader.version == 1 and not reader.pull()
    buf = reader.arrays["w"]
    snap.publish({"w": np.full(3, 2, np.float32)})
    assert reader.pull() and reader.arrays["w"] is buf and buf[0] == 2  # copied in place


@pytest.mark.timeout(120)
def test_pulls_never_see_a_half_written_snapshot():
    snap = WeightSnapshot()
    snap.publish({"a": np.ones(4096, np.float32), "b": np.ones((64, 64), np.float32)})  # version 1
    stop = threading.Event()

    def publisher():
        v = 1
        while not stop.is_set():
            v += 1
            snap.publish({"a": np.full(4096, v, np.float32), "b": np.full((64, 64), v, np.float32)})

    t = threading.Thread(target=publisher, name="test-publisher")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch the GIL often, so pulls and publishes interleave
    t.start()
    reader, torn, changed, pulls = SnapshotReader(snap), 0, 0, 0
    try:
        # at least 1e5 pulls, and enough of them landing on new versions to mean something
        while pulls < 100_000 or changed < 200:
            pulls += 1
            if pulls % 1000 == 0 and not t.is_alive():  # fail now, not at the test's timeout
                raise AssertionError("the publisher thread died")
            if reader.pull():
                changed += 1
                a, b = reader.arrays["a"], reader.arrays["b"]
                # the publisher fills every array with the version number it publishes
                if not (np.all(a == a[0]) and np.all(b == a[0]) and a[0] == reader.version):
                    torn += 1
    finally:
        stop.set()
        t.join(10)
        sys.setswitchinterval(old)
    assert torn == 0


# --- the learner's status record -----------------------------------------------------------------
def test_the_learner_status_is_a_typed_record_that_round_trips_as_plain_data_and_keeps_unknown_keys():
    import msgpack

    from sacbot.wire.status import LearnerStatus

    st = LearnerStatus(learner_steps=7, losses={"critic": 0.5}, last_save={"path": "w/x.zip", "step": 7})
    wire = msgpack.unpackb(msgpack.packb(st.to_dict()))  # as it crosses a process learner's pipe
    assert LearnerStatus.from_dict(wire) == st
    # A host's partial word is laid over the record; keys no field names go to extra, not lost.
    later = st.but(learner_alive=False, closed=True, transitions_received=12)
    assert (later.learner_alive, later.closed, later.learner_steps) == (False, True, 7)
    assert later.extra == {"transitions_received": 12} and later.to_dict()["transitions_received"] == 12
    assert st.learner_alive and st.extra == {}  # records are never changed in place
    with pytest.raises(AttributeError):
        _ = st.learner_stpes  # a misspelt field fails at once, where a dict's .get gave a default


def test_a_link_takes_whole_records_and_merges_partial_dicts():
    from sacbot.wire.boundary import LearnerLink
    from sacbot.wire.status import LearnerStatus

    link = LearnerLink(4)
    link.push_status(LearnerStatus(processed=5, learner_steps=9))
    link.push_status({"learner_alive": False, "last_error": "gone"})
    st = link.status()
    assert (st.processed, st.learner_steps, st.learner_alive, st.last_error) == (5, 9, False, "gone")
    assert link.wait_processed(5, timeout=1.0) and not link.wait_processed(6, timeout=0.05)
