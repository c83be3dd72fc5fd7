"""Bot process: messages, channels, snapshot, drain-then-train, Agent, eval mode."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import break_learner
from helpers import ACT_SPACE, OBS_SPACE, dir_digests, play, small_cfg

from sacbot import Agent
from sacbot.acting import policy
from sacbot.acting.agent import AgentError
from sacbot.config import ConfigError
from sacbot.learning.training import TrainingState, handle_message, train_pass
from sacbot.wire.channels import Channel, SaveSlot
from sacbot.wire.messages import MessageError, NewEpisode, Shutdown, Transition, decode, encode, make_transition
from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot

pytestmark = pytest.mark.timeout(60)



def tr(i=0.0, term=False, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], term, trunc, obs_dim=3, act_dim=1)


# --- messages -----------------------------------------------------------------------
def test_every_message_round_trips_through_msgpack():
    for msg in (tr(1.5, term=True), NewEpisode("tracker"), NewEpisode(""), Shutdown()):
        back = decode(encode(msg))
        assert type(back) is type(msg) and back == msg
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


# --- channels -------------------------------------------------------------------------
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


# --- snapshot ---------------------------------------------------------------------------
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


# --- drain-then-train (plain functions, no threads) ----------------------------------
def test_utd_steps_with_fractional_carry(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path, utd_ratio=0.75, learning_starts=0), 3, 1)
    steps = []
    for _ in range(4):
        for i in range(3):
            handle_message(st, tr(i))
        steps.append(train_pass(st)["grad_steps"])
    assert steps == [2, 2, 2, 3]  # 2.25, 2.5, 2.75, 3.0 owed: remainder carried
    assert st.grad_steps == 9 and st.utd_carry == pytest.approx(0.0)


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


# --- the Agent with real threads --------------------------------------------------------
def test_agent_trains_and_final_save_is_written(tmp_path, learner_kind):
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=1000, learner=learner_kind)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 40)
    st = agent.status()
    assert st["learner_steps"] == 40 - cfg.learning_starts + 1
    assert st["env_steps_received"] == 40 and st["drops"]["transition"] == 0
    from sacbot.store.checkpoint import read_checkpoint
    ck = read_checkpoint(os.path.join(cfg.weights_path, "sac_latest.zip"))
    assert ck["meta"]["env_steps"] == 40 and ck["meta"]["grad_steps"] == st["learner_steps"]
    assert int(open(os.path.join(cfg.weights_path, "round_counter.txt")).read()) == 4
    assert st["final_save"]["ok"] and st["final_save"]["path"].endswith(f"sac_step_{st['learner_steps']}.zip")


def test_the_writer_reports_the_replay_chunks_it_holds_and_saves_stay_complete(tmp_path):
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=5)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 40)
    replay = agent.learner.loop.state.replay
    # After the final save the I/O thread holds every stored chunk at its current generation.
    assert agent.learner.loop.held == {0: int(replay.chunk_gen[0])}
    receipts = [json.loads(line) for line in open(os.path.join(cfg.weights_path, "saves.jsonl"))]
    assert len(receipts) >= 2 and not any("error" in r for r in receipts)
    from sacbot.store.checkpoint import read_checkpoint
    ck = read_checkpoint(os.path.join(cfg.weights_path, "sac_latest.zip"))
    assert np.array_equal(ck["arrays"]["replay.obs"], replay.obs[:40])


def test_eval_mode_sends_nothing_and_writes_no_weights(tmp_path, learner_kind):
    cfg = small_cfg(tmp_path, pace="lockstep", learner=learner_kind)
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 20)
    wdir = cfg.weights_path
    before = dir_digests(wdir)
    ecfg = dataclasses.replace(cfg, eval_mode=True)
    agent = Agent(ecfg, OBS_SPACE, ACT_SPACE)
    assert agent.learner is None  # no learner, no writer, no queue
    a1 = agent.act(np.zeros(3))
    agent.observe(0.0, np.zeros(3), False, False)
    agent.new_episode("other")
    a2 = agent.act(np.zeros(3))
    assert np.array_equal(a1, a2)  # deterministic
    agent.observe(0.0, np.zeros(3), True, False)
    agent.close()
    assert dir_digests(wdir) == before


@pytest.mark.parametrize("change", [dict(hidden=16), dict(quant="off")])
def test_resuming_a_bot_with_other_settings_is_a_config_error_that_changes_no_file(tmp_path, change):
    cfg = small_cfg(tmp_path, pace="lockstep")
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 20)
    wdir = cfg.weights_path
    before = dir_digests(wdir)
    key, value = next(iter(change.items()))
    with pytest.raises(ConfigError, match=f"{key} = .*this run asks for {key} = {value!r}.*Nothing in"):
        Agent(dataclasses.replace(cfg, **change), OBS_SPACE, ACT_SPACE, log=lambda m: None)
    assert dir_digests(wdir) == before  # nothing set aside as corrupt, nothing overwritten
    # Eval plays the exported actor, which carries its own sizes: the flag does not matter there.
    agent = Agent(dataclasses.replace(cfg, eval_mode=True, **change), OBS_SPACE, ACT_SPACE, log=lambda m: None)
    assert agent.loaded_from is not None and agent.params is not None
    agent.close()
    assert dir_digests(wdir) == before


@pytest.mark.parametrize("field,flag", [("run_dir", "--run-dir"), ("weights_path", "--weights-path")])
def test_a_file_where_a_directory_should_be_is_a_clear_error(tmp_path, field, flag):
    from sacbot.acting.agent import AgentError
    (tmp_path / "taken").write_text("keep me")
    cfg = dataclasses.replace(small_cfg(tmp_path), **{field: str(tmp_path / "taken")})
    with pytest.raises(AgentError, match=f"{flag} .*taken' cannot be used as a directory: a file is in the way"):
        Agent(cfg, OBS_SPACE, ACT_SPACE, log=lambda m: None)
    assert (tmp_path / "taken").read_text() == "keep me"


def test_game_loop_mistakes_are_refused_with_what_went_wrong(tmp_path):
    from sacbot.acting.agent import AgentError
    agent = Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE, log=lambda m: None)
    agent.new_episode()
    with pytest.raises(AgentError, match="observe\\(\\) needs a preceding act\\(\\)"):
        agent.observe(0.0, np.zeros(3), False, False)
    agent.act(np.zeros(3))
    for reward in ("1", b"1", None, float("inf")):
        with pytest.raises(MessageError, match="reward must be"):
            agent.observe(reward, np.zeros(3), False, False)
    agent.observe(1.0, np.zeros(3), False, False)  # the refused calls left the step open
    agent.act(np.zeros(3))
    agent.close()
    with pytest.raises(AgentError, match="act\\(\\) after close"):
        agent.act(np.zeros(3))
    with pytest.raises(AgentError, match="observe\\(\\) after close"):
        agent.observe(0.0, np.zeros(3), False, False)


def test_episode_outcomes_from_info_give_win_rates(tmp_path):
    from sacbot.acting.latency import summary
    cfg = small_cfg(tmp_path, pace="lockstep")
    with Agent(cfg, OBS_SPACE, ACT_SPACE) as agent:
        for k, won in enumerate([True, 0, np.int64(1), None, "yes"]):  # 0/1 as games often report it
            agent.new_episode("duck" if k < 3 else "other")
            agent.act(np.zeros(3))
            agent.observe(1.0, np.zeros(3), True, False, {} if won is None else {"won": won})
    recs = [json.loads(line) for line in open(os.path.join(cfg.run_dir, "episodes.jsonl"))]
    assert [r.get("won") for r in recs] == [True, False, True, None, None]
    per = summary(agent)["per_opponent"]
    assert per["duck"]["win_rate"] == pytest.approx(2 / 3) and "win_rate" not in per["other"]


def test_eval_in_a_fresh_clone_plays_the_pretrained_bot_of_its_env(tmp_path, monkeypatch):
    from sacbot.acting.agent import AgentError
    from sacbot.store import checkpoint as ck
    cfg = small_cfg(tmp_path, env="some/Env-v0")
    st = TrainingState.fresh(cfg, 3, 1)
    ck.write_checkpoint(str(tmp_path / "shipped"), st.payload(False), config=cfg.to_dict(),
                        spaces={"obs_dim": 3, "act_dim": 1})
    os.makedirs(tmp_path / "clone" / "weights" / "pretrained")
    os.replace(tmp_path / "shipped" / ck.LATEST, tmp_path / "clone" / "weights" / "pretrained" / "bot.zip")
    monkeypatch.chdir(tmp_path / "clone")
    logs = []
    ecfg = dataclasses.replace(cfg, weights_path="weights", eval_mode=True)
    agent = Agent(ecfg, OBS_SPACE, ACT_SPACE, log=logs.append)
    assert agent.loaded_from == os.path.join("weights", "pretrained", "bot.zip")
    assert any("pretrained bot" in m for m in logs)
    agent.new_episode()
    want, _ = policy.act(agent.params, np.zeros(3, np.float32), agent.pstate, None)
    assert np.allclose(agent.act(np.zeros(3)), want * 2.0)  # the shipped actor, scaled to [-2, 2]
    agent.close()
    with pytest.raises(AgentError, match="no valid checkpoint"):  # another env: not this bot
        Agent(dataclasses.replace(ecfg, env="other/Env-v0"), OBS_SPACE, ACT_SPACE, log=logs.append)
    with pytest.raises(AgentError, match="no valid checkpoint"):  # an explicit path: no fallback
        Agent(dataclasses.replace(ecfg, weights_path="elsewhere"), OBS_SPACE, ACT_SPACE, log=logs.append)


def test_bad_observation_from_the_game_names_the_problem(tmp_path):
    with Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE) as agent:
        agent.new_episode()
        with pytest.raises(MessageError, match="shape"):
            agent.act(np.zeros(4))
        with pytest.raises(MessageError, match="non-finite"):
            agent.act(np.array([0, np.inf, 0]))
        agent.act(np.zeros(3))
        with pytest.raises(MessageError, match="reward"):
            agent.observe(float("nan"), np.zeros(3), False, False)
        assert agent.status()["env_steps_received"] == 0


def test_learner_failure_keeps_acting_and_is_reported(tmp_path, learner_kind):
    cfg = small_cfg(tmp_path, learning_starts=1, learner=learner_kind)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    says = break_learner(agent, learner_kind)
    agent.new_episode()
    obs = np.zeros(3)
    for _ in range(cfg.batch_size):  # enough for the first batch: the update runs and fails
        agent.act(obs)
        agent.observe(0.0, obs, False, False)
    assert agent.learner.wait_for(lambda st: not st["learner_alive"], 30)
    version = agent.learner.snapshot.version  # published before the failure; nothing after it
    for _ in range(50):  # acting goes on with the last weights
        assert np.isfinite(agent.act(obs)).all()
        agent.observe(0.0, obs, False, False)
    st = agent.status()
    assert says in st["last_error"] and says in agent.learner_error and not st["learner_alive"]
    assert agent.policy_version == version
    agent.close()


def test_a_stop_mid_pass_keeps_the_remaining_steps_owed(tmp_path):
    st = TrainingState.fresh(small_cfg(tmp_path, learning_starts=0, utd_ratio=4), 3, 1)
    for i in range(3):
        handle_message(st, tr(i))
    stop = threading.Event()
    original = st.learner.update

    def update_then_stop(batch):  # the close arrives during the 5th step
        if st.grad_steps == 4:
            stop.set()
        return original(batch)

    st.learner.update = update_then_stop
    line = train_pass(st, stop=stop)
    assert line["grad_steps"] == 5 and st.grad_steps == 5
    assert st.utd_carry == pytest.approx(7.0)  # 12 owed, 5 taken


def _play_until(agent, done, max_steps=400):
    """Play until the learner's status satisfies ``done``; return that status."""
    obs = np.zeros(3, np.float32)
    agent.new_episode("x")
    for _ in range(max_steps):
        agent.act(obs)
        agent.observe(0.0, obs, False, False)
        # Every offered save is attempted by the writer, and its outcome reaches the status.
        if agent.learner.wait_for(done, 0.05):
            return agent.learner.status()
    raise AssertionError("not enough saves were offered")


@pytest.mark.timeout(60)
def test_save_into_an_unwritable_path_is_counted_and_retried(tmp_path, learner_kind):
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=3, learner=learner_kind)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    blocker = os.path.join(cfg.weights_path, "sac_latest.zip")
    os.makedirs(os.path.join(blocker, "x"))  # a directory where the file must go: the rename fails
    _play_until(agent, lambda st: st.get("save_errors", 0) >= 1)
    st = agent.status()
    # One failed save at least: a second offer may fail too before this status is read.
    failed = st["save_errors"]
    assert failed >= 1 and st["saves"] == 0 and st["learner_alive"] and "Error" in st["last_error"]
    os.rmdir(os.path.join(blocker, "x"))
    os.rmdir(blocker)
    st = _play_until(agent, lambda st: st.get("saves", 0) >= 1)
    assert st["learner_alive"]
    agent.close()
    receipts = [json.loads(x) for x in open(os.path.join(cfg.weights_path, "saves.jsonl"))]
    errors = [r for r in receipts if "error" in r]
    # Every failure is receipted and counted, and once the path is free saves succeed.
    assert len(errors) == agent.status()["save_errors"] >= failed
    assert receipts[:len(errors)] == errors and all(r["bytes"] > 0 for r in receipts[len(errors):])
    assert len(receipts) > len(errors)


@pytest.mark.timeout(60)
def test_full_disk_is_counted_and_the_next_save_succeeds(tmp_path, monkeypatch):
    import errno

    from sacbot.store import checkpoint as ck
    real, calls = ck.atomic_write, []

    def full_disk_once(path, write):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, write)

    from sacbot.store import write as ck_write

    monkeypatch.setattr(ck_write, "atomic_write", full_disk_once)  # in this process: the thread learner
    cfg = small_cfg(tmp_path, pace="lockstep", save_interval=3)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    st = _play_until(agent, lambda st: st.get("saves", 0) >= 1)
    assert st["save_errors"] == 1 and st["saves"] >= 1 and st["learner_alive"]
    assert "No space left" in (st["last_error"] or "")
    agent.close()
    assert ck.read_checkpoint(os.path.join(cfg.weights_path, ck.LATEST))["meta"]["grad_steps"] > 0


def test_a_layout_change_is_published_whole():
    snap = WeightSnapshot()
    reader = SnapshotReader(snap)
    snap.publish({"w": np.ones((2, 3), np.float32), "flag": np.array(False)})
    assert reader.pull() and reader.arrays["w"].dtype == np.float32
    snap.publish({"w": np.full((2, 3), -7, np.int8), "w_scale": np.array([0.5, 0.25], np.float32),
                  "flag": np.array(True)})
    assert reader.pull()
    assert reader.arrays["w"].dtype == np.int8 and (reader.arrays["w"] == -7).all()
    assert reader.arrays["w_scale"].tolist() == [0.5, 0.25] and bool(reader.arrays["flag"])


# --- many sources, one learner ------------------------------------------------------------
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

    pushed: list[dict] = []
    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=3, act_dim=1, spaces={"obs_dim": 3, "act_dim": 1},
                       metrics_path=cfg.metrics_path, weights_dir=cfg.weights_dir)
    versions = iter(range(1, 100))
    loop = training.LearnerLoop(spec, None, Inbox(), lambda arrays: next(versions), pushed.append, threading.Event())
    loop.run()
    during = [p for p in pushed if p.get("processed") == 0 and p.get("learner_steps")]
    assert [p["learner_steps"] for p in during] == [4, 8]  # the pass's own publishes, before it ended
    assert during[-1]["policy_version_published"] > during[0]["policy_version_published"]
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
            return {**self.status(), "final_save": {"ok": True}}

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


def test_a_ray_bot_sends_what_it_queued_before_closing(monkeypatch):
    """A bot's sender closes with one last call for what waits in its outbox: here the close comes
    while a send call is in progress and more transitions wait, which were left behind before."""
    from sacbot.app import ray_cluster
    from sacbot.wire.channels import transitions_in
    from sacbot.wire.messages import decode_batch

    gate, in_call = threading.Event(), threading.Event()
    got: list[int] = []

    def send(source, data, info, seq):
        in_call.set()
        assert gate.wait(30), "the test never let the first call finish"
        got.append(sum(transitions_in(m) for m in decode_batch(data)))
        return "ref"

    # The actor's methods, called in the sender's and the puller's threads.
    learner = SimpleNamespace(send=SimpleNamespace(remote=send),
                              pull=SimpleNamespace(remote=lambda version: None),
                              status=SimpleNamespace(remote=lambda: {"learner_alive": True}))

    class FakeRay:  # refs are the values: every call has finished by the time it returns
        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            return refs[:num_returns], refs[num_returns:]

        @staticmethod
        def get(ref, timeout=None):
            return ref

    monkeypatch.setattr(ray_cluster, "require_ray", lambda: FakeRay)
    link = ray_cluster.RayLearnerClient(learner, source=0, queue_size=64)
    assert link.send([tr(i) for i in range(64)]) == 64  # a full call: sent at once
    assert in_call.wait(30)
    assert link.send([tr(i) for i in range(10)]) == 10  # queued while that call is on its way
    closer = threading.Thread(target=link.close, name="test-close")
    closer.start()
    assert link._stop.wait(30)  # the close has told the sender
    gate.set()
    closer.join(30)
    assert not closer.is_alive()
    assert got == [64, 10]


@pytest.mark.timeout(60)
def test_reward_input_appends_the_previous_reward_to_what_the_learner_sees(tmp_path):
    """With reward_input the networks' observation is (obs, previous reward): 0 at an episode's
    start, and a transition's next_obs carries its own reward, which is the next act's input."""
    from sacbot.learning.sac import SACLSTMLearner
    from sacbot.wire.boundary import LearnerLink

    class Recording(LearnerLink):
        def wait_ready(self, timeout):
            return True

        def spaces(self):
            return 4, 1

        def close(self, acting_rng=None, timeout=0.0):
            return {**self.status(), "final_save": {"ok": True}}

    cfg = small_cfg(tmp_path, reward_input=True)
    link = Recording(queue_size=100)
    link.publish(SACLSTMLearner(4, 1, cfg).export_actor())  # the learner's input is obs_dim + 1
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE, learner=link)
    rewards = [0.5, -2.0, 0.25]
    for _ in range(2):
        agent.new_episode("x")
        for t, r in enumerate(rewards):
            agent.act(np.full(3, t, np.float32))
            agent.observe(r, np.full(3, t + 1, np.float32), False, t == len(rewards) - 1)
    sent = [m for m in link.outbox.drain() if isinstance(m, Transition)]
    assert len(sent) == 6
    for k, t in enumerate(sent):
        step = k % 3
        assert t.obs.tolist() == [step] * 3 + [0.0 if step == 0 else rewards[step - 1]]
        assert t.next_obs.tolist() == [step + 1] * 3 + [rewards[step]]
    agent.act(np.zeros(3, np.float32))  # after a terminal step without new_episode(): a fresh start
    agent.observe(1.0, np.zeros(3, np.float32), False, False)
    assert [m for m in link.outbox.drain() if isinstance(m, Transition)][0].obs[-1] == 0.0
    with pytest.raises(AgentError, match="obs_dim 3.*reward_input"):  # the other layout is refused
        Agent(small_cfg(tmp_path, reward_input=False, run_dir=str(tmp_path / "r2")), OBS_SPACE, ACT_SPACE,
              learner=link)
    agent.close()


@pytest.mark.timeout(60)
def test_eval_of_a_bot_trained_without_reward_input_names_the_setting(tmp_path):
    """An upgrade case: the POMDP presets turn reward_input on; a bot saved before must be named
    as of the other setting (not only as a narrower input), and evals with it off."""
    with Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE) as agent:
        play(agent, 12)
    with pytest.raises(ConfigError, match="reward_input = False, this run asks for reward_input = True"):
        Agent(small_cfg(tmp_path, eval_mode=True, reward_input=True, run_dir=str(tmp_path / "e1")),
              OBS_SPACE, ACT_SPACE)
    with Agent(small_cfg(tmp_path, eval_mode=True, run_dir=str(tmp_path / "e2")), OBS_SPACE, ACT_SPACE) as ev:
        assert ev.loaded_from is not None
