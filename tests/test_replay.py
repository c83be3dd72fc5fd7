"""Sequence replay: windows stay inside episodes, masks are right, flags are kept apart."""

from __future__ import annotations

import numpy as np

from sacbot.replay import SequenceReplay


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
