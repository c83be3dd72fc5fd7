"""The Agent in a game loop, with real learner threads and processes: training, eval mode, faults."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading

import numpy as np
import pytest
from conftest import break_learner
from helpers import ACT_SPACE, OBS_SPACE, dir_digests, play, small_cfg

from sacbot import Agent
from sacbot.acting import policy
from sacbot.acting.agent import AgentError
from sacbot.config import ConfigError
from sacbot.learning.training import TrainingState, handle_message, train_pass
from sacbot.wire.messages import MessageError, NewEpisode, Transition, make_transition
from sacbot.wire.snapshot import SnapshotReader, WeightSnapshot

pytestmark = pytest.mark.timeout(60)



def tr(i=0.0, term=False, trunc=False):
    return make_transition([i, 0, 0], [0.5], 1.0, [i + 1, 0, 0], term, trunc, obs_dim=3, act_dim=1)


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
        Agent(dataclasses.replace(cfg, **change), OBS_SPACE, ACT_SPACE)
    assert dir_digests(wdir) == before  # nothing set aside as corrupt, nothing overwritten
    # Eval plays the exported actor, which carries its own sizes: the flag does not matter there.
    agent = Agent(dataclasses.replace(cfg, eval_mode=True, **change), OBS_SPACE, ACT_SPACE)
    assert agent.loaded_from is not None and agent.params is not None
    agent.close()
    assert dir_digests(wdir) == before


@pytest.mark.parametrize("field,flag", [("run_dir", "--run-dir"), ("weights_path", "--weights-path")])
def test_a_file_where_a_directory_should_be_is_a_clear_error(tmp_path, field, flag):
    from sacbot.acting.agent import AgentError
    (tmp_path / "taken").write_text("keep me")
    cfg = dataclasses.replace(small_cfg(tmp_path), **{field: str(tmp_path / "taken")})
    with pytest.raises(AgentError, match=f"{flag} .*taken' cannot be used as a directory: a file is in the way"):
        Agent(cfg, OBS_SPACE, ACT_SPACE)
    assert (tmp_path / "taken").read_text() == "keep me"


def test_game_loop_mistakes_are_refused_with_what_went_wrong(tmp_path):
    from sacbot.acting.agent import AgentError
    agent = Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE)
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


def test_eval_in_a_fresh_clone_plays_the_pretrained_bot_of_its_env(tmp_path, monkeypatch, caplog):
    from sacbot.acting.agent import AgentError
    from sacbot.store import checkpoint as ck
    cfg = small_cfg(tmp_path, env="some/Env-v0")
    st = TrainingState.fresh(cfg, 3, 1)
    ck.write_checkpoint(str(tmp_path / "shipped"), st.payload(False), config=cfg.to_dict(),
                        spaces={"obs_dim": 3, "act_dim": 1})
    os.makedirs(tmp_path / "clone" / "weights" / "pretrained")
    os.replace(tmp_path / "shipped" / ck.LATEST, tmp_path / "clone" / "weights" / "pretrained" / "bot.zip")
    monkeypatch.chdir(tmp_path / "clone")
    caplog.set_level(logging.INFO, logger="sacbot")
    ecfg = dataclasses.replace(cfg, weights_path="weights", eval_mode=True)
    agent = Agent(ecfg, OBS_SPACE, ACT_SPACE)
    assert agent.loaded_from == os.path.join("weights", "pretrained", "bot.zip")
    assert any("pretrained bot" in m for m in caplog.messages)
    agent.new_episode()
    want, _ = policy.act(agent.params, np.zeros(3, np.float32), agent.pstate, None)
    assert np.allclose(agent.act(np.zeros(3)), want * 2.0)  # the shipped actor, scaled to [-2, 2]
    agent.close()
    with pytest.raises(AgentError, match="no valid checkpoint"):  # another env: not this bot
        Agent(dataclasses.replace(ecfg, env="other/Env-v0"), OBS_SPACE, ACT_SPACE)
    with pytest.raises(AgentError, match="no valid checkpoint"):  # an explicit path: no fallback
        Agent(dataclasses.replace(ecfg, weights_path="elsewhere"), OBS_SPACE, ACT_SPACE)


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
    assert agent.learner.wait_for(lambda st: not st.learner_alive, 30)
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
    _play_until(agent, lambda st: st.save_errors >= 1)
    st = agent.status()
    # One failed save at least: a second offer may fail too before this status is read.
    failed = st["save_errors"]
    assert failed >= 1 and st["saves"] == 0 and st["learner_alive"] and "Error" in st["last_error"]
    os.rmdir(os.path.join(blocker, "x"))
    os.rmdir(blocker)
    st = _play_until(agent, lambda st: st.saves >= 1)
    assert st.learner_alive
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
    st = _play_until(agent, lambda st: st.saves >= 1)
    assert st.save_errors == 1 and st.saves >= 1 and st.learner_alive
    assert "No space left" in (st.last_error or "")
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


@pytest.mark.timeout(60)
def recording_link(obs_dim: int, act_dim: int, queue_size: int):
    """A learner boundary nobody drains: what the agent sent stays in its outbox for the test."""
    from sacbot.wire.boundary import LearnerLink

    class Recording(LearnerLink):
        def wait_ready(self, timeout):
            return True

        def spaces(self):
            return obs_dim, act_dim

        def close(self, acting_rng=None, timeout=0.0):
            return self.status().but(final_save={"ok": True})

    return Recording(queue_size=queue_size)


def test_reward_input_appends_the_previous_reward_to_what_the_learner_sees(tmp_path):
    """With reward_input the networks' observation is (obs, previous reward): 0 at an episode's
    start, and a transition's next_obs carries its own reward, which is the next act's input."""
    from sacbot.learning.sac import SACLSTMLearner
    cfg = small_cfg(tmp_path, reward_input=True)
    link = recording_link(4, 1, queue_size=100)
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


def test_after_transitions_dropped_by_a_full_queue_the_next_one_starts_a_new_chain(tmp_path):
    """A free-paced game outruns its learner: the queue drops transitions.  The next one that gets a
    place goes after a gap marker, so the replay never chains it to the one before the gap."""
    from sacbot.learning.sac import SACLSTMLearner

    cfg = small_cfg(tmp_path)
    link = recording_link(3, 1, queue_size=3)
    link.publish(SACLSTMLearner(3, 1, cfg).export_actor())
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE, learner=link)

    def play(ticks):
        for t in ticks:
            agent.act(np.full(3, t, np.float32))
            agent.observe(0.0, np.full(3, t + 1, np.float32), False, False)
        return [m if isinstance(m, NewEpisode) else float(m.obs[0]) for m in link.outbox.drain()]

    agent.new_episode("x")
    # 3 found the queue full; 4's marker found no place either, so 4 is dropped, not sent after 2.
    assert play(range(5)) == [NewEpisode("x"), 0.0, 1.0, 2.0]
    assert play(range(5, 8)) == [NewEpisode("x", gap=True), 5.0, 6.0]  # the marker took a place: 7 dropped
    assert play(range(8, 10)) == [NewEpisode("x", gap=True), 8.0, 9.0]
    assert play(range(10, 12)) == [10.0, 11.0]  # nothing lost since: one chain
    drops = agent.status()["drops"]
    assert drops["transition"] == 3 and drops["other"] == 0 and agent.unsent == 0  # 3, 4 and 7; 4's marker: none
    agent.new_episode("x")
    assert play(range(4)) == [NewEpisode("x"), 0.0, 1.0, 2.0]  # 3 dropped: a gap at the episode's end
    agent.new_episode("x")
    assert play(range(1)) == [NewEpisode("x"), 0.0]  # the new episode's start is the new chain
    agent.close()


def test_reward_input_squash_symlog_scales_the_input_not_the_reward_learnt_from(tmp_path):
    """symlog keeps large rewards near the observation's size as an input; the transition's own
    reward, which the critic learns from, is the game's."""
    from sacbot.learning.sac import SACLSTMLearner
    cfg = small_cfg(tmp_path, reward_input=True, reward_input_squash="symlog")
    link = recording_link(4, 1, queue_size=100)
    link.publish(SACLSTMLearner(4, 1, cfg).export_actor())
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE, learner=link)
    agent.new_episode("x")
    for r in (-100.0, 9.0, 0.0):
        agent.act(np.zeros(3, np.float32))
        agent.observe(r, np.zeros(3, np.float32), False, False)
    sent = [m for m in link.outbox.drain() if isinstance(m, Transition)]
    assert [t.reward for t in sent] == [-100.0, 9.0, 0.0]
    np.testing.assert_allclose([t.next_obs[-1] for t in sent], [-np.log(101.0), np.log(10.0), 0.0], rtol=1e-6)
    np.testing.assert_allclose([t.obs[-1] for t in sent], [0.0, -np.log(101.0), np.log(10.0)], rtol=1e-6)
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


def test_episodes_carry_cumulative_env_steps_across_a_resume(tmp_path):
    """episodes.jsonl's env_steps is the x axis of return curves (as SB3's global_step): it goes on
    counting from the checkpoint's env steps after a resume, not from 0."""
    cfg = small_cfg(tmp_path)
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    play(agent, 30)
    assert agent.close()["final_save"]["ok"]
    agent = Agent(cfg, OBS_SPACE, ACT_SPACE)
    play(agent, 20)
    agent.close()
    with open(tmp_path / "run" / "episodes.jsonl") as fh:
        eps = [json.loads(x) for x in fh]
    assert [e["env_steps"] for e in eps] == [10, 20, 30, 40, 50]


def test_observe_with_gymnasiums_order_names_the_order_it_takes(tmp_path):
    agent = Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE)
    try:
        agent.new_episode("x")
        obs = np.zeros(3, np.float32)
        agent.act(obs)
        with pytest.raises(MessageError, match=r"reward first: gymnasium's step\(\) returns the observation first"):
            agent.observe(obs, 1.0, False, False)  # (obs, reward, ...) as env.step gives them
        with pytest.raises(MessageError, match=r"reward must be finite") as e:
            agent.observe(float("nan"), obs, False, False)
        assert "reward first" not in str(e.value)  # a bad reward alone gets no hint about the order
    finally:
        agent.close()


def test_a_learner_that_fails_to_build_for_a_reason_not_a_setting_is_not_reported_as_a_config_error(
        tmp_path, monkeypatch):
    # A bug (here a KeyError inside the learner's build) must read as the learner's failure, exit 1,
    # not as a bad setting, exit 2: only a ConfigError is the user's to fix.
    from sacbot.learning import training

    def broken(*a, **kw):
        raise KeyError("a key the code, not the user, got wrong")

    monkeypatch.setattr(training.TrainingState, "fresh", broken)
    with pytest.raises(AgentError, match="the learner failed to build: KeyError: .a key the code") as e:
        Agent(small_cfg(tmp_path), OBS_SPACE, ACT_SPACE)
    assert not isinstance(e.value, ConfigError)
