"""The training loop as plain functions and as a loop: drain, then train at the UTD ratio, many sources."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import ACT_SPACE, OBS_SPACE, small_cfg

from sacbot import Agent
from sacbot.learning.training import TrainingState, handle_message, train_pass
from sacbot.store import state as ck_state
from sacbot.wire.messages import NewEpisode, Shutdown, Transition, make_transition

pytestmark = pytest.mark.timeout(60)



def tr(i=0.0, term=False, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], term, trunc, obs_dim=3, act_dim=1)


def test_utd_steps_with_fractional_carry(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path, utd_ratio=0.75, learning_starts=0), 3, 1)
    steps = []
    for _ in range(4):
        for i in range(3):
            handle_message(st, tr(i))
        steps.append(train_pass(st)["grad_steps"])
    assert steps == [2, 2, 2, 3]  # 2.25, 2.5, 2.75, 3.0 owed: remainder carried
    assert st.grad_steps == 9 and st.utd_carry == pytest.approx(0.0)


def test_a_carry_rounded_up_to_a_whole_step_leaves_none_not_a_negative_remainder(tmp_path):
    """Floating sums land a hair below a whole step (0.1 ten times is 0.9999999999999999): the step
    is taken, and the carry left is 0, never -1e-16, which a checkpoint's validation refuses (a
    cluster's final save was refused for utd_carry = -5.7e-14)."""
    from sacbot.learning.training import steps_owed

    st = TrainingState.fresh(small_cfg(tmp_path, utd_ratio=0.1, learning_starts=0), 3, 1)
    taken = 0
    for _ in range(10):
        st.pending = 1
        taken += steps_owed(st)
        assert st.utd_carry >= 0.0
    assert taken == 1 and st.utd_carry == 0.0
    assert not ck_state.training_state_problem(st.payload(False)["meta"], {"spaces": {}})


def test_a_long_pass_publishes_every_64_steps_and_leaves_the_last_to_the_caller(tmp_path, monkeypatch):
    import sacbot.learning.training as training

    monkeypatch.setattr(training, "PUBLISH_EVERY_STEPS", 4)
    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=0), 3, 1)
    at = []
    for i in range(10):
        handle_message(st, tr(i))
    train_pass(st, publish=lambda: at.append(st.grad_steps))
    assert at == [4, 8]  # not at 10: the caller publishes once the pass ends
    for i in range(4):
        handle_message(st, tr(i))
    train_pass(st, publish=lambda: at.append(st.grad_steps))
    assert at == [4, 8]  # a pass of exactly 4 steps: only the caller's


@pytest.mark.parametrize("memoryless", [False, True])
def test_memoryless_control_trains_on_single_steps_and_acts_without_state(tmp_path, memoryless):
    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=0, memoryless=memoryless), 3, 1)
    seen = []
    real = st.learner.update
    st.learner.update = lambda b: seen.append(b) or real(b)
    for i in range(10):
        handle_message(st, make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], False, False, obs_dim=3, act_dim=1))
    train_pass(st)
    assert len(seen) == 10
    # (B, T, A): the same number of transitions per update, as B windows of 4 or 4B single steps
    assert {b.act.shape[:2] for b in seen} == ({(8, 1)} if memoryless else {(2, 4)})
    if memoryless:
        assert all(not b.prev_act0.any() for b in seen)
    # The nets see what acting sees: in the control, one-step sequences with no previous action,
    # for the next step too (its actions feed the critic target).
    calls = []
    real_actor = st.learner.actor.forward
    st.learner.actor.forward = lambda obs, prev, hc=None: calls.append((obs.shape, prev.abs().sum())) or \
        real_actor(obs, prev, hc)
    handle_message(st, make_transition([9, 0, 0], [0.5], 1.0, [10, 0, 0], False, False, obs_dim=3, act_dim=1))
    train_pass(st)
    (shape, prev_sum), = calls
    assert (tuple(shape[:2]), float(prev_sum) == 0.0) == (((1, 16), True) if memoryless else ((5, 2), False))
    from sacbot.store import checkpoint as ck
    cfg = small_cfg(tmp_path, memoryless=memoryless, eval_mode=True)
    ck.write_checkpoint(cfg.weights_path, st.payload(False), config=cfg.to_dict(), spaces={"obs_dim": 3, "act_dim": 1})
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    agent.new_episode()
    x = np.array([0.3, -0.2, 0.9])
    acts = [agent.act(x) for _ in range(3)]  # an eval loop may act alone
    agent.close()
    # Without memory the same observation gives the same action; with it, the state moves on.
    assert all(np.array_equal(acts[0], a) for a in acts) == memoryless


def test_no_steps_before_learning_starts(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=10), 3, 1)
    for i in range(9):
        handle_message(st, tr(i))
    assert train_pass(st)["grad_steps"] == 0
    handle_message(st, tr(9))
    assert train_pass(st)["grad_steps"] == 1


def test_saves_are_offered_inside_the_step_loop_and_drops_counted(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=0, save_interval=3, utd_ratio=5), 3, 1)
    offers = []

    def offer(state):  # the I/O slot is busy after the first offer
        offers.append(state.grad_steps)
        return len(offers) == 1

    for i in range(4):
        handle_message(st, tr(i))
    line = train_pass(st, offer)
    assert line["grad_steps"] == 20
    assert offers == [3, 6, 9, 12, 15, 18]  # one burst, six saves offered at the interval
    assert st.save_offers_dropped == 5


def test_opponent_change_clears_by_default_and_keep_keeps(tmp_path):
    for policy_, expect in (("clear", 0), ("keep", 3)):
        st = TrainingState.fresh(small_cfg(tmp_path, opponent_policy=policy_), 3, 1)
        handle_message(st, NewEpisode("walker"))
        for i in range(3):
            handle_message(st, tr(i, term=i == 2))
        handle_message(st, NewEpisode("walker"))
        assert len(st.replay) == 3
        handle_message(st, NewEpisode("spinner"))
        assert len(st.replay) == expect


def test_a_gap_marker_breaks_the_chain_and_nothing_else(tmp_path):
    """After transitions lost to a full queue, the episode goes on in a new chain: no sampled window
    steps over the gap; the episode count, the opponent and the replay's rows are as they were."""
    st = TrainingState.fresh(small_cfg(tmp_path, opponent_policy="clear"), 3, 1)
    handle_message(st, NewEpisode("walker"))
    for i in range(3):
        handle_message(st, tr(i))
    handle_message(st, NewEpisode("", gap=True))  # another opponent's name would clear: a gap never does
    for i in range(5, 8):
        handle_message(st, tr(i))
    assert st.episodes == 1 and st.opponent == {0: "walker"} and len(st.replay) == 6
    rows = {float(st.replay.obs[r, 0]): r for r in range(6)}
    assert st.replay.next[rows[2.0]] == -1 and st.replay.prev[rows[5.0]] == -1  # two chains
    assert st.replay.next[rows[1.0]] == rows[2.0] and st.replay.prev[rows[6.0]] == rows[5.0]
    idx = st.replay.sample_indices(6, 6, np.random.default_rng(0))
    for w in idx:
        firsts = {float(st.replay.obs[r, 0]) for r in w if r >= 0}
        assert firsts <= {0.0, 1.0, 2.0} or firsts <= {5.0, 6.0, 7.0}, firsts


def test_a_new_opponent_clears_only_that_sources_rows_and_opponents_survive_a_resume(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path), 3, 1)
    for source, opp in ((0, "walker"), (1, "spinner")):
        handle_message(st, NewEpisode(opp), source)
    for i in range(3):
        for source in (0, 1):
            handle_message(st, tr(10 * source + i), source)
    assert len(st.replay) == 6
    handle_message(st, NewEpisode("tracker"), 1)  # bot 1 meets another opponent
    held = st.replay.episode[:st.replay.capacity] >= 0
    assert len(st.replay) == 3 and set(st.replay.source[:st.replay.capacity][held].tolist()) == {0}
    handle_message(st, NewEpisode("walker"), 0)  # bot 0's opponent is unchanged: kept
    assert len(st.replay) == 3 and st.opponent == {0: "walker", 1: "tracker"}
    p = st.payload(with_replay=True)
    arrays = {**p["arrays"], **{k: np.concatenate([c["arrays"][k] for c in p["replay_chunks"]])
                                for k in p["replay_chunks"][0]["arrays"]}}
    again = TrainingState.fresh(small_cfg(tmp_path), 3, 1)
    again.load_payload(arrays, p["meta"])
    assert again.opponent == st.opponent and len(again.replay) == 3
    handle_message(again, NewEpisode("spinner"), 0)  # bot 0's opponent was restored: it clears
    assert len(again.replay) == 0
    old = {k: v for k, v in p["meta"].items() if k != "opponents"}
    for opponent, expect in (("walker", {0: "walker"}), (None, {})):  # a one-bot checkpoint's
        again.load_payload(arrays, {**old, "opponent": opponent})
        assert again.opponent == expect


def test_the_learner_loop_takes_source_message_pairs_and_plain_messages(tmp_path):
    """A many-bot learner queues (source, message) pairs; a bot's own learner queues bare
    messages (source 0).  Both go to the right source's stream; Shutdown ends the loop."""
    from sacbot.learning.training import LearnerLoop
    from sacbot.wire.boundary import LearnerSpec

    cfg = small_cfg(tmp_path, learning_starts=1000)
    items = [(0, NewEpisode("a")), (7, NewEpisode("b"))]
    for i in range(4):
        items += [(0, tr(i)), (7, tr(100 + i))]
    items += [tr(4), (7, Shutdown()), (7, tr(999))]  # nothing after Shutdown goes in

    class Inbox:
        def recv(self, timeout):
            return items.pop(0) if items else None

        def drain(self):
            out = items[:]
            items.clear()
            return out

    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=3, act_dim=1, spaces={"obs_dim": 3, "act_dim": 1},
                       metrics_path=cfg.metrics_path, weights_dir=cfg.weights_dir)
    loop = LearnerLoop(spec, None, Inbox(), lambda arrays: 1, lambda status: None, threading.Event())
    loop.run()
    r = loop.state.replay
    rows = np.flatnonzero(r.episode[:r.capacity] >= 0)
    got = sorted((int(r.source[i]), float(r.obs[i, 0])) for i in rows)
    assert got == [(0, 0.0), (0, 1.0), (0, 2.0), (0, 3.0), (0, 4.0), (7, 100.0), (7, 101.0), (7, 102.0), (7, 103.0)]
    assert loop.state.opponent == {0: "a", 7: "b"} and loop.final_save["ok"]


def test_status_is_pushed_inside_a_long_pass_with_its_steps(tmp_path, monkeypatch):
    """A pass runs up to MAX_PASS_STEPS; under load (a cluster on two busy cores, 2.9 steps/s) that
    took over a minute in which the learner's status still said 0 steps and no save."""
    import sacbot.learning.training as training
    from sacbot.wire.boundary import LearnerSpec

    monkeypatch.setattr(training, "PUBLISH_EVERY_STEPS", 4)
    cfg = small_cfg(tmp_path, learning_starts=0, hidden=4)
    batches = [[NewEpisode("a")] + [tr(i) for i in range(12)], [Shutdown()]]

    class Inbox:  # one pass of 12 steps, then the shutdown
        def recv(self, timeout):
            return batches[0].pop(0) if batches[0] else None

        def drain(self):
            return batches.pop(0)[:] if len(batches) > 1 else []

    pushed: list = []
    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=3, act_dim=1, spaces={"obs_dim": 3, "act_dim": 1},
                       metrics_path=cfg.metrics_path, weights_dir=cfg.weights_dir)
    versions = iter(range(1, 100))
    loop = training.LearnerLoop(spec, None, Inbox(), lambda arrays: next(versions), pushed.append, threading.Event())
    loop.run()
    during = [p for p in pushed if p.processed == 0 and p.learner_steps]
    assert [p.learner_steps for p in during] == [4, 8]  # the pass's own publishes, before it ended
    assert during[-1].policy_version_published > during[0].policy_version_published


    # (A save made in the pass shows as soon as the I/O thread reports it: not checked here, since
    # when it finishes writing is the I/O thread's business.)
def test_a_long_backlog_is_trained_in_capped_passes_and_nothing_owed_is_lost(tmp_path):
    """A learner behind its bots used to run one pass of every owed step, publishing nothing
    until it ended; passes are capped and the rest stays owed."""
    from sacbot.learning.training import MAX_PASS_STEPS

    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=0, utd_ratio=2, hidden=4), 3, 1)
    n = MAX_PASS_STEPS // 2 + 10  # owes 2n > MAX_PASS_STEPS steps
    for i in range(n):
        handle_message(st, tr(i))
    first = train_pass(st)
    assert first["grad_steps"] == MAX_PASS_STEPS and first["drained"] == n
    assert st.utd_carry == pytest.approx(2 * n - MAX_PASS_STEPS)
    second = train_pass(st)  # no new data: the carried steps are taken
    assert second["grad_steps"] == 2 * n - MAX_PASS_STEPS and st.grad_steps == 2 * n


@pytest.mark.timeout(30)
def test_a_learner_far_behind_never_makes_new_episode_wait_and_no_episode_is_chained(tmp_path):
    """With even the reserved control places full, new_episode() used to wait 5 s on the acting
    thread; now the episode is not sent at all (counted), so its transitions cannot be chained to
    the previous episode."""
    from sacbot.learning.sac import SACLSTMLearner
    from sacbot.wire.boundary import LearnerLink

    class Stalled(LearnerLink):  # a learner that never drains its queue
        def wait_ready(self, timeout):
            return True

        def close(self, acting_rng=None, timeout=0.0):
            return self.status().but(final_save={"ok": True})

    cfg = small_cfg(tmp_path)
    link = Stalled(queue_size=2)
    link.publish(SACLSTMLearner(3, 1, cfg).export_actor())
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE, learner=link)
    while link.outbox.send(NewEpisode("filler")):
        pass  # every reserved place taken
    queued = link.outbox._q.qsize()
    agent.new_episode("x")  # returns at once: acting never waits
    for _ in range(3):
        agent.act(np.zeros(3))
        agent.observe(0.0, np.zeros(3), False, False)
    assert link.outbox._q.qsize() == queued  # nothing of that episode went out
    st = agent.status()
    assert st["drops"]["other"] >= 1 and st["drops"]["episode_not_started"] == 3
    agent.close()


@pytest.mark.timeout(60)
def test_the_shared_learner_takes_a_restarted_bot_and_refuses_what_would_stop_or_poison_it(tmp_path):
    """LearnerServer (the Ray learner's body, used here without Ray): a restarted bot numbers its
    batches from 1 again under a new client id and is taken; a Shutdown, other spaces or
    non-finite values from one bot are refused for the whole batch, and the learner goes on."""
    from sacbot.app.ray_cluster import LearnerServer
    from sacbot.wire.boundary import LearnerSpec
    from sacbot.wire.messages import encode_batch

    cfg = small_cfg(tmp_path)
    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=3, act_dim=1, spaces={},
                       metrics_path=str(tmp_path / "m.jsonl"), weights_dir=str(tmp_path / "w"))
    server = LearnerServer(spec, queue_size=1000)
    try:
        batch = encode_batch([NewEpisode("x")] + [tr(i) for i in range(4)])
        for n in (1, 2):
            server.send(0, batch, {}, (n, 1, "first-run"))
        assert server.status()["transitions_received"] == 8
        server.send(0, batch, {}, (1, 1, "after-restart"))  # numbers from 1 again, a new client
        assert server.status()["transitions_received"] == 12
        bad = [encode_batch([Shutdown("")]),
               encode_batch([make_transition([0, 0], [0.5], 1.0, [0, 0], False, False, obs_dim=2, act_dim=1)]),
               encode_batch([Transition(np.zeros(3, np.float32), np.full(1, np.nan, np.float32), 0.0,
                                        np.zeros(3, np.float32), False, False)])]
        for b in bad:
            server.send(1, b, {}, None)
        st = server.status()
        assert st["refused_at_learner"] == 3 and st["transitions_received"] == 12 and st["learner_alive"]
    finally:
        final = server.close(timeout=30)
    assert final["final_save"]["ok"]
