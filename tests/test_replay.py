"""Sequence replay: windows stay inside episodes, masks are right, flags are kept apart."""

from __future__ import annotations

import numpy as np

from sacbot.learning.replay import SequenceReplay
from sacbot.wire.messages import NewEpisode, make_transition


def episodic_buffer(lengths, capacity=1000, end="terminated"):
    """obs[0] = episode id, obs[1] = step within the episode, so windows can be checked."""
    buf = SequenceReplay(capacity, 2, 1)
    for ep, n in enumerate(lengths):
        for t in range(n):
            last = t == n - 1
            buf.add([ep, t], [t / 100], float(t), [ep, t + 1], last and end == "terminated",
                    last and end == "truncated")
    return buf


def test_windows_never_cross_an_episode_and_masks_match():
    buf = episodic_buffer([5, 40, 3, 17, 60])
    rng = np.random.default_rng(0)
    for _ in range(50):
        b = buf.sample(16, 8, rng)
        assert b.obs.shape == (16, 9, 2) and b.mask.shape == (16, 8)
        for i in range(16):
            n = int(b.valid[i].sum())
            assert np.all(b.valid[i, :n] == 1) and np.all(b.valid[i, n:] == 0), "valid is a prefix"
            ep, t0 = b.obs[i, 0]
            assert np.all(b.obs[i, 1:n + 1, 0] == ep), "a window crossed an episode boundary"
            assert np.array_equal(b.obs[i, 1:n + 1, 1], t0 + 1 + np.arange(n))
            assert np.all(b.obs[i, n + 1:] == 0) and np.all(b.rew[i, n:] == 0), "padding is zero"
            assert np.array_equal(b.mask[i], b.valid[i])  # no burn-in: every valid step counts


def test_window_ends_exactly_at_the_terminal_step():
    buf = episodic_buffer([4])
    b = buf.sample(4, 10, np.random.default_rng(1))
    for i in range(4):
        n = int(b.valid[i].sum())
        t0 = int(b.obs[i, 0, 1])
        assert n == 4 - t0
        assert b.terminated[i, n - 1] == 1 and b.terminated[i, : n - 1].sum() == 0


def test_terminated_and_truncated_are_kept_apart():
    term = episodic_buffer([3, 3], end="terminated").sample(6, 4, np.random.default_rng(0))
    trunc = episodic_buffer([3, 3], end="truncated").sample(6, 4, np.random.default_rng(0))
    assert term.terminated.sum() > 0 and term.truncated.sum() == 0
    assert trunc.truncated.sum() > 0 and trunc.terminated.sum() == 0


def test_prev_action_is_zero_only_at_episode_start():
    buf = episodic_buffer([10, 10])
    b = buf.sample(20, 3, np.random.default_rng(2))
    for i in range(20):
        t0 = int(b.obs[i, 0, 1])
        expected = 0.0 if t0 == 0 else (t0 - 1) / 100
        assert b.prev_act0[i, 0] == np.float32(expected)


def test_burn_in_reaches_back_inside_the_episode_and_is_masked():
    buf = episodic_buffer([30, 30])
    b = buf.sample(60, 5, np.random.default_rng(3), burn_in=4)
    assert b.mask.shape == (60, 9)
    for i in range(60):
        first_t = int(b.obs[i, 0, 1])
        burn = int((b.mask[i] == 0).argmin()) if b.mask[i].any() else 0
        assert burn <= 4 and (burn == 4 or first_t == 0), "burn-in shorter only at an episode start"
        assert b.mask[i].sum() <= 5


def test_sampling_is_deterministic_for_a_generator():
    buf = episodic_buffer([7, 20, 13])
    a = buf.sample(8, 6, np.random.default_rng(5))
    b = buf.sample(8, 6, np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_ring_wraparound_keeps_windows_in_order():
    buf = episodic_buffer([50] * 5, capacity=64)  # 250 transitions into 64 slots
    assert len(buf) == 64
    b = buf.sample(64, 20, np.random.default_rng(4))
    for i in range(64):
        n = int(b.valid[i].sum())
        assert np.all(np.diff(b.obs[i, : n + 1, 1]) == 1), "a window jumped across the write head"


def test_export_import_round_trip_and_clear():
    buf = episodic_buffer([5, 9, 4], capacity=16)
    arrays, meta = buf.export()
    other = SequenceReplay(16, 2, 1)
    other.load(arrays, meta)
    a = buf.sample(8, 4, np.random.default_rng(0))
    b = other.sample(8, 4, np.random.default_rng(0))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    other.clear()
    assert len(other) == 0 and not other.can_sample(1, 1)


def test_a_saved_empty_buffer_resumes_empty():
    """A bot closed before its first transition saved no replay chunk; resuming it failed with
    KeyError 'replay.obs' (and was set aside as corrupt)."""
    buf = SequenceReplay(10, 3, 1)
    chunks, meta = buf.export_chunks()
    assert chunks == []
    again = SequenceReplay(10, 3, 1)
    again.load({}, meta)
    assert len(again) == 0 and again.head == 0


# --- many sources in one ring -----------------------------------------------------------
def interleaved(lengths_by_source, rows, capacity, first_episode=None):
    """Sources take turns row by row; source s plays episodes of ``lengths_by_source[s]`` steps.
    obs = [source, episode number within that source, step], act = [step]."""
    buf = SequenceReplay(capacity, 3, 1)
    count = {s: 0 for s in range(len(lengths_by_source))}
    for r in range(rows):
        s = r % len(lengths_by_source)
        n = count[s]
        ep, t = divmod(n, lengths_by_source[s])
        last = t == lengths_by_source[s] - 1
        buf.add([s, ep, t], [t], float(s), [s, ep, t + 1], last and s != 1, last and s == 1, source=s)
        count[s] += 1
    return buf


def stored_steps(buf):
    """(source, episode) -> (first step, last step) among the rows that hold a transition."""
    out: dict = {}
    for i in np.flatnonzero(buf.episode[:buf.capacity] >= 0):
        s, ep, t = (int(x) for x in buf.obs[i])
        lo, hi = out.get((s, ep), (t, t))
        out[(s, ep)] = (min(lo, t), max(hi, t))
    return out


def check_links(buf):
    """The links form chains inside episodes: a row's predecessor names it as its successor and
    was written before it; rows without a transition hold no links."""
    cap = buf.capacity
    held = buf.episode[:cap] >= 0
    assert len(buf) == held.sum()
    age = (np.arange(cap) - (buf.head - buf.size)) % cap
    for links, back in ((buf.prev, buf.next), (buf.next, buf.prev)):
        rows = np.flatnonzero(held & (links[:cap] >= 0))
        assert np.all(back[links[rows]] == rows) and np.all(buf.episode[links[rows]] == buf.episode[rows])
        assert np.all(buf.source[links[rows]] == buf.source[rows])
        assert np.all(links[:cap][~held] == -1)
    rows = np.flatnonzero(held & (buf.prev[:cap] >= 0))
    assert np.all(age[buf.prev[rows]] < age[rows])


def check_windows(buf, batch, seq_len, burn_in, rng, sources=None):
    """Every window stays in one source's episode, steps follow each other in its stream, and it
    is as long as the rows stored allow (it stops only at an episode's or a source's end)."""
    spans = stored_steps(buf)
    state = rng.bit_generator.state
    idx = buf.sample_indices(batch, seq_len, rng, burn_in)
    rng.bit_generator.state = state
    b = buf.sample(batch, seq_len, rng, burn_in)
    T = burn_in + seq_len
    assert idx.shape == (batch, T) and b.obs.shape == (batch, T + 1, 3)
    for i in range(batch):
        n = int(b.valid[i].sum())
        assert np.all(b.valid[i, :n] == 1) and np.all(b.valid[i, n:] == 0), "valid is a prefix"
        assert np.array_equal(idx[i] >= 0, b.valid[i] == 1)
        s, ep, t0 = (int(x) for x in b.obs[i, 0])
        rows = idx[i, :n]
        assert np.all(buf.source[rows] == s) and len(set(buf.episode[rows].tolist())) == 1, "mixed a window"
        assert np.all(b.obs[i, 1:n + 1, 0] == s) and np.all(b.obs[i, 1:n + 1, 1] == ep), "crossed a source"
        assert np.array_equal(b.obs[i, 1:n + 1, 2], t0 + 1 + np.arange(n)), "steps do not follow"
        assert np.array_equal(b.act[i, :n, 0], t0 + np.arange(n)) and np.all(b.rew[i, :n] == s)
        lo, hi = spans[(s, ep)]
        back = int(b.mask[i].argmax())  # the start drawn is always a real step
        assert back == burn_in or t0 == lo, "burn-in short of what is stored"
        assert n == min(T, hi - t0 + 1), "a window stopped before its episode's end"
        assert b.mask[i].sum() == min(seq_len, n - back)
        assert b.prev_act0[i, 0] == (t0 - 1 if t0 > lo else 0), "prev_act0 from another stream"
        assert np.all(b.obs[i, n + 1:] == 0) and np.all(b.act[i, n:] == 0), "padding is zero"
        if sources is not None:
            assert s in sources


def test_sampled_windows_never_cross_sources_or_episodes():
    """Three bots interleaved row by row, episodes of 7, 13 and 29 steps, the ring wrapped."""
    buf = interleaved([7, 13, 29], rows=1500, capacity=1000)
    assert len(buf) == 1000
    check_links(buf)
    rng = np.random.default_rng(0)
    for burn_in in (0, 5):
        for _ in range(40):
            check_windows(buf, 16, 12, burn_in, rng)


def test_a_long_episode_and_an_idle_source_whose_rows_were_overwritten():
    """An episode longer than the ring, and a source whose newest row was overwritten while it
    was idle: its next transition must not link to the row now in that place."""
    buf = SequenceReplay(10, 3, 1)
    buf.add([0, 0, 0], [0], 0.0, [0, 0, 1], False, False, source=0)
    for t in range(25):
        buf.add([1, 0, t], [t], 1.0, [1, 0, t + 1], False, False, source=1)
    buf.add([0, 0, 1], [1], 0.0, [0, 0, 2], False, False, source=0)  # row 0 was overwritten
    assert buf.prev[buf.head - 1] == -1
    rng = np.random.default_rng(1)
    for _ in range(20):
        check_windows(buf, 10, 8, 3, rng)
    check_links(buf)


def test_a_source_that_overwrites_its_own_newest_row_does_not_link_to_itself():
    """Its newest row is the oldest in the ring: writing the next one in its place must not make
    the row its own predecessor (a window would then repeat one step)."""
    for cap, others in ((1, 0), (4, 3)):
        buf = SequenceReplay(cap, 3, 1)
        buf.add([0, 0, 0], [0], 0.0, [0, 0, 1], False, False, source=0)
        for t in range(others):
            buf.add([1, 0, t], [t], 1.0, [1, 0, t + 1], False, False, source=1)
        buf.add([0, 0, 1], [1], 0.0, [0, 0, 2], False, False, source=0)  # lands on row 0
        assert buf.prev[0] == -1 and buf.next[0] == -1
        check_windows(buf, cap, 3, 2, np.random.default_rng(0))
        check_links(buf)


def test_clearing_one_source_keeps_the_others_intact():
    buf = interleaved([7, 13, 29], rows=900, capacity=1000)
    before = {k: v for k, v in stored_steps(buf).items() if k[0] != 1}
    gens = buf.chunk_gen.copy()
    buf.clear(1)
    assert len(buf) == 600 and buf.size == 900 and 1 not in buf.open
    assert stored_steps(buf) == before
    check_links(buf)
    assert np.all(buf.chunk_gen > gens), "the chunks that held the cleared rows must be saved again"
    rng = np.random.default_rng(2)
    for burn_in in (0, 4):
        for _ in range(30):
            check_windows(buf, 16, 10, burn_in, rng, sources={0, 2})
    # The cleared source starts afresh: not linked to what it had.
    buf.add([1, 99, 0], [0], 1.0, [1, 99, 1], False, False, source=1)
    assert buf.prev[buf.head - 1] == -1 and len(buf) == 601
    # Clearing what is left resets the ring as a whole clear does.
    buf.clear(0), buf.clear(2), buf.clear(1)
    assert len(buf) == 0 and buf.head == buf.size == 0


def test_starts_are_drawn_only_among_rows_that_hold_data():
    """After a clear that leaves 2 rows of 1000, every start is one of them (the redraws run out
    and the fallback over the held rows takes over), and both are drawn."""
    buf = SequenceReplay(1000, 3, 1)
    for r in range(1000):
        s = 0 if r in (10, 500) else 1
        buf.add([s, 0, r], [0], 0.0, [s, 0, r + 1], True, False, source=s)
    buf.clear(1)
    assert len(buf) == 2
    seen = set()
    rng = np.random.default_rng(3)
    for _ in range(50):
        idx = buf.sample_indices(2, 1, rng)
        seen.update(idx[:, 0].tolist())
    assert seen == {10, 500}
    buf.add([0, 1, 0], [0], 0.0, [0, 1, 1], True, False, source=0)  # lands on row 0
    starts = np.concatenate([buf.sample_indices(3, 1, rng)[:, 0] for _ in range(50)])
    assert set(starts.tolist()) == {0, 10, 500} and (starts == 0).sum() > 20, "the new row is drawn as often"


def test_linking_a_row_bumps_the_chunk_of_the_row_it_follows():
    """Row 0's ``next`` is written when its source's next row lands in another chunk: a chunked
    save that skipped chunk 0 would resume with the episode cut."""
    buf = SequenceReplay(10_000, 3, 1)
    c = buf.chunk_rows
    buf.add([0, 0, 0], [0], 0.0, [0, 0, 1], False, False, source=0)
    for t in range(c):
        buf.add([1, 0, t], [t], 0.0, [1, 0, t + 1], False, False, source=1)
    held = {k: int(g) for k, g in enumerate(buf.chunk_gen)}
    buf.add([0, 0, 1], [1], 0.0, [0, 0, 2], False, False, source=0)  # row c + 1, chunk 1
    assert buf.next[0] == c + 1
    chunks, _ = buf.export_chunks(since=held)
    assert [ch["index"] for ch in chunks] == [0, 1]
    # Overwriting row 0 unlinks its successor, row c + 1: that chunk is written too.
    for t in range(buf.capacity - buf.head):
        buf.add([1, 1, t], [t], 0.0, [1, 1, t + 1], False, False, source=1)
    held = {k: int(g) for k, g in enumerate(buf.chunk_gen)}
    buf.add([1, 1, 99], [0], 0.0, [1, 1, 100], False, False, source=1)  # lands on row 0
    assert buf.prev[c + 1] == -1 and buf.prev[0] == buf.capacity - 1
    chunks, _ = buf.export_chunks(since=held)
    last = (buf.capacity - 1) // c  # the row it follows, source 1's newest
    assert [ch["index"] for ch in chunks] == [0, 1, last]


def concatenated(chunks):
    """What the checkpoint loader makes of the chunks: each array's rows, in chunk order."""
    names = chunks[0]["arrays"] if chunks else {}
    return {k: np.concatenate([ch["arrays"][k] for ch in chunks]) for k in names}


def test_many_sources_survive_a_save_and_resume_exactly():
    buf = interleaved([7, 13, 29], rows=1234, capacity=1000)
    buf.clear(2)
    buf.add([2, 50, 0], [0], 2.0, [2, 50, 1], False, False, source=2)
    chunks, meta = buf.export_chunks()
    again = SequenceReplay(1000, 3, 1)
    again.load(concatenated(chunks), meta)
    for k in ("episode", "source", "prev", "next", "obs"):
        assert np.array_equal(getattr(again, k), getattr(buf, k)), k
    assert (again.head, again.size, len(again), again.open, again.next_episode) == \
        (buf.head, buf.size, len(buf), buf.open, buf.next_episode)
    for burn_in in (0, 3):
        a = buf.sample(32, 9, np.random.default_rng(7), burn_in)
        b = again.sample(32, 9, np.random.default_rng(7), burn_in)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # Both continue alike: open episodes chain on, across the resume.
    for r in (buf, again):
        for s in range(3):
            r.add([s, 77, 0], [0], 0.0, [s, 77, 1], False, False, source=s)
    for k in ("episode", "source", "prev", "next"):
        assert np.array_equal(getattr(again, k), getattr(buf, k)), k


def old_format(buf):
    """``buf``'s export as a checkpoint from before many-source replay wrote it: no source or
    links, and one current episode in the meta."""
    arrays, meta = buf.export()
    arrays = {k: v for k, v in arrays.items() if k.split(".")[1] not in ("source", "prev", "next")}
    open_ = buf.open.get(0)
    meta = {"capacity": meta["capacity"], "head": meta["head"], "size": meta["size"],
            "current_episode": open_[0] if open_ else buf.next_episode, "episode_open": open_ is not None}
    return arrays, meta


def test_a_single_stream_export_from_before_sources_loads():
    for rows, cap in ((50, 64), (300, 64)):  # not full, and wrapped with the head mid-ring
        buf = SequenceReplay(cap, 2, 1)  # episodes of 13, the last one left open
        for r in range(rows):
            ep, t = divmod(r, 13)
            buf.add([ep, t], [t / 100], float(t), [ep, t + 1], False, t == 12)
        again = SequenceReplay(cap, 2, 1)
        again.load(*old_format(buf))
        for k in ("episode", "source", "prev", "next"):
            assert np.array_equal(getattr(again, k), getattr(buf, k)), k
        assert again.open == buf.open and len(again) == len(buf)
        a = buf.sample(16, 20, np.random.default_rng(8), 4)
        b = again.sample(16, 20, np.random.default_rng(8), 4)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        for r in (buf, again):  # the open episode chains on
            r.add([99, 0], [0], 0.0, [99, 1], False, False)
        assert again.prev[again.head - 1] == buf.prev[buf.head - 1] >= 0


def test_capacity_change_with_several_sources_keeps_the_newest_rows_linked():
    buf = interleaved([7, 13, 29], rows=900, capacity=600)
    arrays, meta = buf.export()
    newest = {tuple(buf.obs[(buf.head - k) % 600]) for k in range(1, 201)}
    for cap in (200, 1000):
        again = SequenceReplay(cap, 3, 1)
        again.load(arrays, meta)
        assert len(again) == min(cap, 600) and again.head == min(cap, 600) % cap
        if cap == 200:
            assert {tuple(again.obs[i]) for i in range(200)} == newest
        check_links(again)
        rng = np.random.default_rng(9)
        for burn_in in (0, 6):
            for _ in range(20):
                check_windows(again, 16, 15, burn_in, rng)
        # Every source's open episode chains on to its newest row.
        for s in range(3):
            last = again.open[s][1]
            assert tuple(again.obs[last]) == tuple(buf.obs[buf.open[s][1]])
            again.add([s, 0, 0], [0], 0.0, [s, 0, 1], False, False, source=s)
            assert again.prev[(again.head - 1) % cap] == last


def test_a_source_must_be_a_non_negative_int():
    buf = SequenceReplay(10, 3, 1)
    for bad in (-1, 2**31, 1.5, "3"):
        try:
            buf.add([0, 0, 0], [0], 0.0, [0, 0, 0], False, False, source=bad)
        except (ValueError, TypeError):
            continue
        raise AssertionError(f"source {bad!r} was taken")
    buf.add([0, 0, 0], [0], 0.0, [0, 0, 0], False, False, source=np.int64(3))
    assert list(buf.open) == [3] and type(next(iter(buf.open))) is int


def test_a_senders_batches_reach_the_learner_in_order_whatever_order_ray_runs_them():
    """The Ray learner runs calls concurrently, so one bot's batches can arrive out of order
    (measured: 242 of 2,000 calls overtook the one before); InOrder puts them back."""
    import random

    from sacbot.app.ray_cluster import InOrder

    order = InOrder(window=4)
    seqs = list(range(1, 2001))
    rng = random.Random(0)
    arrived = []
    for i in range(0, len(seqs), 4):  # calls in flight are at most 4: any order within them
        chunk = seqs[i:i + 4]
        rng.shuffle(chunk)
        arrived += [(s, chunk and min(seqs[i:i + 4])) for s in chunk]  # (number, oldest in flight)
    out = [b for s, floor in arrived for b in order.put(s, floor, s)]
    assert out == seqs and order.lost == 0
    # A lost batch (its call failed) is skipped once more than `window` wait behind it.
    lossy = InOrder(window=4)
    got = [b for s in [1, 2, 4, 5, 6, 7, 8, 3, 9] for b in lossy.put(s, 1, s)]
    assert got == [1, 2, 4, 5, 6, 7, 8, 9] and lossy.lost == 1  # 3 came too late: a duplicate now
    fresh = InOrder(window=4)  # a restarted learner meets the bot mid-stream
    assert [b for s in (58, 57, 59) for b in fresh.put(s, 57, s)] == [57, 58, 59]


def test_a_restarted_bot_is_a_new_client_and_its_batches_are_not_taken_for_duplicates():
    """A bot restarted by Ray numbers its batches from 1 again; the learner used to drop all of
    them as retried duplicates, silently, for as long as the bot had run before."""
    from sacbot.app.ray_cluster import InOrder

    before = InOrder(4, client="a")
    assert [b for s in range(1, 101) for b in before.put(s, s, s)] == list(range(1, 101))
    assert before.put(1, 1, "again") == []  # the same client: a duplicate, rightly dropped
    restarted = InOrder(4, client="b")  # what LearnerServer.send makes when the client id changes
    assert [b for s in (1, 2, 3) for b in restarted.put(s, 1, s)] == [1, 2, 3]


def test_the_ray_learner_opens_a_new_chain_after_dropping_a_bots_transitions():
    """The Ray learner's inbox drops when full; a bot's next transition that gets in goes after a
    gap marker, one per gap, and an episode start needs none."""
    from sacbot.app.ray_cluster import LearnerServer
    from sacbot.wire.channels import Channel

    server = object.__new__(LearnerServer)  # its delivery alone: no learner loop, no Ray
    server.inbox, server._chains = Channel(3), {}
    server._received = server._dropped_here = 0

    def deliver(*msgs, source=0):
        for m in msgs:
            server._deliver(source, m)
        got = [(s, m if isinstance(m, NewEpisode) else float(m.obs[0])) for s, m in server.inbox.drain()]
        return got

    def t(i):
        return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], False, False, obs_dim=3, act_dim=1)

    # 3 dropped: a gap; 4's marker found the queue full too, so 4 is dropped, not chained after 2.
    assert deliver(NewEpisode("a"), t(0), t(1), t(2), t(3), t(4)) == [(0, NewEpisode("a")), (0, 0.0), (0, 1.0),
                                                                      (0, 2.0)]
    assert deliver(t(5), t(6)) == [(0, NewEpisode("", gap=True)), (0, 5.0), (0, 6.0)]
    assert deliver(t(7), t(8), source=1) == [(1, 7.0), (1, 8.0)]  # another bot: its own chain
    assert deliver(t(9), t(10), t(11), t(12)) == [(0, 9.0), (0, 10.0), (0, 11.0)]
    assert deliver(t(13)) == [(0, NewEpisode("", gap=True)), (0, 13.0)]
    assert deliver(NewEpisode("b"), t(0)) == [(0, NewEpisode("b")), (0, 0.0)]  # a new episode: no marker
    assert server._dropped_here == 3 and server._received == 12


def test_the_ray_learner_opens_a_new_chain_for_a_bot_met_mid_episode_and_after_a_lost_batch():
    """A restarted Ray learner holds each bot's chain as its checkpoint saved it, and a batch whose
    call failed is skipped: either way the bot's next transition must not chain across the loss."""
    import threading
    import types

    from sacbot.app.ray_client import MAX_IN_FLIGHT
    from sacbot.app.ray_cluster import LearnerServer
    from sacbot.wire.channels import Channel
    from sacbot.wire.messages import Transitions, encode_batch

    server = object.__new__(LearnerServer)  # its intake alone: no learner loop, no Ray
    server.inbox, server._chains, server._order, server._bots = Channel(100), {}, {}, {}
    server._received = server._dropped_here = server._refused = 0
    server._lock, server._snap, server.spec = threading.Lock(), (0, b""), types.SimpleNamespace(obs_dim=3, act_dim=1)

    def t(i):
        return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], False, False, obs_dim=3, act_dim=1)

    def call(seq, *steps, client="c"):
        server.send(0, encode_batch([t(i) for i in steps]), {}, (seq, seq, client))
        out = []
        for _, m in server.inbox.drain():
            out += [float(x) for x in m.obs[:, 0]] if isinstance(m, Transitions) else [m]
        return out

    assert call(1, 0, 1) == [NewEpisode("", gap=True), 0.0, 1.0]  # met mid-episode: after what it lost
    assert call(2, 2) == [2.0]
    # Batch 3's call failed: it is given up once more than MAX_IN_FLIGHT wait behind it.
    waiting = [call(4 + k, 4 + k) for k in range(MAX_IN_FLIGHT)]
    assert waiting == [[]] * MAX_IN_FLIGHT
    assert call(4 + MAX_IN_FLIGHT, 4 + MAX_IN_FLIGHT) == [NewEpisode("", gap=True)] + [
        float(4 + k) for k in range(MAX_IN_FLIGHT + 1)]
    assert server._received == 4 + MAX_IN_FLIGHT


def _replay_state(buf: SequenceReplay) -> dict:
    arrays = {k: getattr(buf, k).copy() for k in ("obs", "next_obs", "act", "rew", "terminated", "truncated",
                                                   "episode", "source", "prev", "next")}
    return {**arrays, "scalars": (buf.head, buf.size, buf.n_valid, buf.next_episode),
            "open": {s: tuple(v) for s, v in buf.open.items()}}


def test_add_batch_stores_exactly_what_the_same_adds_would():
    """The columnar write (what the Ray learner uses for a bot's batch) against add() row by row,
    on a small ring that wraps many times: episodes ending inside a block, several sources, a
    source's newest row overwritten by its own block, blocks as long as the ring, clears."""
    rng = np.random.default_rng(3)
    one, many = SequenceReplay(37, 2, 1), SequenceReplay(37, 2, 1)
    one.chunk_rows = many.chunk_rows = 8  # several chunks in a small ring
    one.chunk_gen = np.zeros(5, np.int64)
    many.chunk_gen = np.zeros(5, np.int64)
    for step in range(400):
        source = int(rng.integers(0, 3))
        r = rng.random()
        if r < 0.05:
            one.start_episode(source)
            many.start_episode(source)
        elif r < 0.08:
            one.clear(source)
            many.clear(source)
        n = int(rng.choice([1, 2, 5, 17, 36, 37, 40]))
        obs = rng.standard_normal((n, 2)).astype(np.float32)
        act = rng.standard_normal((n, 1)).astype(np.float32)
        rew = rng.standard_normal(n).astype(np.float32)
        nxt = rng.standard_normal((n, 2)).astype(np.float32)
        term, trunc = rng.random(n) < 0.1, rng.random(n) < 0.05
        gens_before = many.chunk_gen.copy(), one.chunk_gen.copy()
        for k in range(n):
            one.add(obs[k], act[k], rew[k], nxt[k], bool(term[k]), bool(trunc[k]), source)
        many.add_batch(obs, act, rew, nxt, term, trunc, source)
        a, b = _replay_state(one), _replay_state(many)
        for key in a:
            if isinstance(a[key], np.ndarray):
                assert np.array_equal(a[key], b[key]), (step, key, n)
            else:
                assert a[key] == b[key], (step, key, n)
        # A periodic save re-encodes the chunks whose generation moved: the same chunks must move.
        assert np.array_equal(many.chunk_gen != gens_before[0], one.chunk_gen != gens_before[1]), step
