"""The Agent: what a game loop calls every tick.  Acting runs numpy only.

Usage, from any game or env loop (``sacbot.Agent`` is this loop, started by the assembly)::

    with sacbot.Agent(cfg, obs_space, action_space) as agent:
        agent.new_episode(opponent="tracker")
        obs = game.reset()
        while not over:
            action = agent.act(obs)                        # never waits on learning
            obs, reward, terminated, truncated = game.step(action)
            agent.observe(reward, obs, terminated, truncated, info)
        print(agent.status())

``act`` returns an action inside ``action_space``; ``observe`` validates the step and
hands it to the learner through its boundary (``sacbot.wire.boundary``: a bounded queue, dropped and
counted if full).  The Agent holds only that handle, the numpy params, and its own counters;
the assembly (``sacbot.assembly``) builds the learner (a thread, a child process, or a cluster's
Ray actor) and hands the Agent its start; this module never imports it.
``info`` is optional; a boolean ``info["won"]`` at an episode's end is recorded as its outcome
(episodes.jsonl, eval win rates).
In eval mode (``cfg.eval_mode``) actions are deterministic and nothing is sent or saved.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np

from sacbot.acting import policy
from sacbot.acting.errors import AgentError, AgentInterrupted
from sacbot.acting.latency import LatencyWindow
from sacbot.acting.noise import ColoredNoise
from sacbot.acting.spaces import input_dim, learner_spaces, reward_feature, space_dims
from sacbot.config import Config, ConfigError
from sacbot.console import Log
from sacbot.store.files import UnusableDir, append_jsonl, make_dir
from sacbot.store.liveness import Heartbeat, RoundCounter
from sacbot.store.rundir import RunDirClaim, RunDirInUse
from sacbot.wire.boundary import Start, StartError, StartInterrupted
from sacbot.wire.channels import Chain
from sacbot.wire.messages import (
    MAX_ABS_OBS,
    MessageError,
    NewEpisode,
    Transition,
    check_flag,
    check_opponent,
    check_reward,
    check_vector,
)

# How an Agent gets its start: (cfg, obs_dim, act_dim, spaces, logger, learner, stop) -> Start.
# sacbot.Agent passes the assembly's (sacbot.assembly.assemble.assemble); the acting side never
# imports it.
Starter = Callable[..., Start]


class Agent:
    """A bot in a game loop: ``act`` each tick, ``observe`` its outcome, ``new_episode`` at each
    start, ``close`` (or a ``with`` block) at the end, which makes the final save::

        with Agent(cfg, obs_space, action_space) as agent:
            agent.new_episode(opponent="tracker")
            obs = game.reset()
            while not over:
                action = agent.act(obs)
                obs, reward, terminated, truncated, info = game.step(action)
                agent.observe(reward, obs, terminated, truncated, info)

    Note the order of ``observe``: reward first, then the next observation (the original bot's
    order), where gymnasium's ``step`` returns the observation first.  The Agent resumes from the
    newest checkpoint in ``cfg.weights_path``, or starts fresh; in eval mode it acts
    deterministically and sends and saves nothing."""

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, *, start_with: Starter,
                 logger: Log | None = None, learner=None, env_layout: dict | None = None,
                 stop: threading.Event | None = None):
        """``start_with``: what builds the bot's start (its first actor and its learner);
        :class:`sacbot.Agent` passes the assembly's, so a game constructs ``sacbot.Agent``.
        ``learner``: an already running learner to feed (a bot of a Ray cluster feeds the shared
        one); by default the bot assembles its own.  ``env_layout``: the env's
        settings that change what its values mean (sacbot.acting.games.env_layout), saved with the bot.
        ``logger``: where the bot says what it does (default: the "sacbot" logger; a server passes an
        adapter that names the bot).  ``stop``: the game's stop request (a signal handler sets it):
        no wait of the Agent outlasts it, neither the start (AgentInterrupted) nor a lockstep
        observe().

        All or nothing: if the constructor raises, nothing of the bot is left (no thread, no child
        process, no lock held); the learner it had started is ended without a save."""
        self.cfg = cfg
        self.stop = stop
        self.logger = logger or logging.getLogger("sacbot")
        self.obs_dim, self.act_dim = space_dims(obs_space, action_space)
        self.obs_shape = obs_space.shape
        self._low = action_space.low.astype(np.float32)
        self._half = ((action_space.high - action_space.low) / 2).astype(np.float32)
        self.eval_mode = cfg.eval_mode
        self.rng = np.random.default_rng(cfg.seed + 7919)  # acting noise, apart from training's
        # White noise is the generator's own draws, as before coloured noise existed (same numbers).
        self.noise: ColoredNoise | np.random.Generator = (
            ColoredNoise(cfg.noise_color, self.act_dim, self.rng) if cfg.noise_color > 0 else self.rng)
        self.started = time.time()
        self.ticks = self.episodes = self.episodes_started = 0
        self.sent = 0
        self._closed = False
        self._last_obs: np.ndarray | None = None
        self._last_action: np.ndarray | None = None
        self._prev_reward = 0.0  # the input reward_input appends: 0 at an episode's start
        self._ep_return, self._ep_len = 0.0, 0
        self._latency = LatencyWindow()
        # One game loop at a time: the thread that starts an episode owns it until the next
        # new_episode(), and overlapping calls are refused (two loops would interleave two games
        # into one episode's transitions).
        self._calls = threading.Lock()
        self._owner: int | None = None
        self.opponent = ""
        self.results: dict[str, list[float]] = defaultdict(list)
        self.wins: dict[str, list[bool]] = defaultdict(list)  # episodes whose env reported info["won"]
        self.recent: deque[tuple[float, bool | None]] = deque(maxlen=20)  # (return, won) of the last 20
        self.loaded_from: str | None = None
        self.final_save: dict | None = None  # set by close(): {"ok": bool, "path" or "error"}
        self.learner = None
        self._episode_sent = True  # the learner knows where this episode starts
        self._chain = Chain(NewEpisode("", gap=True))  # gap markers after the queue's drops (sacbot.wire.channels)
        self.unsent = 0  # transitions not sent because their episode's start could not be
        self.gap_drops = 0  # transitions not sent because the queue had no place for their gap's marker
        try:
            make_dir(cfg.run_dir, "--run-dir")
        except UnusableDir as e:
            raise AgentError(str(e)) from None
        self.heartbeat = Heartbeat(os.path.join(cfg.run_dir, "status.json"))
        self.episodes_path = os.path.join(cfg.run_dir, "episodes.jsonl")
        if self.eval_mode:
            self.logger.info("EVAL MODE: deterministic actions; nothing is sent to a learner or saved")
        net_obs = input_dim(cfg, self.obs_dim)
        spaces = learner_spaces(net_obs, obs_space, action_space, env_layout)
        self._run_claim = claim_run_dir(cfg)  # released below if the start fails, else by close()
        try:
            start = start_with(cfg, net_obs, self.act_dim, spaces, self.logger, learner=learner, stop=stop)
        except BaseException as e:
            self._run_claim.release()
            if isinstance(e, StartInterrupted):
                raise AgentInterrupted(str(e)) from None
            if isinstance(e, StartError):
                raise AgentError(str(e)) from None
            raise
        try:
            self._take(start)
        except BaseException:  # a value of the checkpoint the acting side refuses, an interrupt, ...
            start.abort()
            self._run_claim.release()
            raise
        _OPEN.add(self)  # closed at exit if the program does not (see _close_forgotten)

    def _take(self, start) -> None:
        # All the Agent keeps of the learning side: the boundary handle and what it last pulled.
        cfg = self.cfg
        self.learner = start.learner
        self._release = start.release
        self.loaded_from = start.loaded_from
        self.params = policy.build_params(start.arrays)
        self.policy_version = start.policy_version
        self.learning_starts_left = 0 if self.eval_mode else max(0, cfg.learning_starts - start.env_steps)
        self.env_steps = start.env_steps  # cumulative over resumes: episodes.jsonl's x axis, as SB3's global_step
        self._env_steps_before = start.env_steps
        self.episode_base = start.episodes
        if start.acting_rng:  # the final save holds the acting noise state: a resume continues it
            try:
                self.rng.bit_generator.state = json.loads(start.acting_rng)
            except (ValueError, TypeError, KeyError) as e:
                raise AgentError(f"checkpoint {start.loaded_from!r} holds an acting noise state (meta acting_rng) "
                                 f"that cannot be restored ({type(e).__name__}: {e}); expected the JSON state of "
                                 "a numpy PCG64 generator. Nothing was changed; to go on from an older checkpoint, "
                                 "move this one out of the weights directory") from None
        self.rounds = None if self.eval_mode else RoundCounter(cfg.round_counter_path)
        self.pstate = policy.initial_state(self.params)

    @property
    def env_steps_played(self) -> int:
        """Transitions this Agent observed (``env_steps`` also counts the runs it resumed from)."""
        return self.env_steps - self._env_steps_before

    @property
    def episode_index(self) -> int:
        """Episodes started so far over the whole run, resumes included: the next one's index."""
        return self.episode_base + self.episodes_started

    # --- the per-tick API ---------------------------------------------------------------
    def act(self, obs) -> np.ndarray:
        """An action for ``obs``, inside the action space.  Never waits on learning.  A second act()
        before observe() drops the first action's step (nothing is recorded for it): an eval loop
        may act alone, and a game loop whose observe() was refused goes on with the next tick."""
        t0 = time.perf_counter_ns()
        if self._closed:
            raise AgentError("act() after close()")
        self._enter("act")
        try:
            return self._act(obs, t0)
        finally:
            self._calls.release()

    def _act(self, obs, t0: int) -> np.ndarray:
        x = self._with_reward(self._check_obs(obs, "obs"), self._prev_reward)
        if self.learner is not None:
            got = self.learner.pull(self.policy_version)  # an int compare unless there is news
            if got is not None:
                self.policy_version, arrays = got
                self.params = policy.build_params(arrays)
        if self.cfg.memoryless:  # the control experiment: nothing carried from the last tick
            self.pstate = policy.initial_state(self.params)
        a, self.pstate = policy.act(self.params, x, self.pstate, None if self.eval_mode else self.noise)
        if self.learning_starts_left > 0:
            # Uniform exploration until learning starts, as SB3 does, or with coloured noise the tick's
            # draw squashed (uniform draws would cancel its drift); the recurrent state still sees the
            # action actually taken.
            a = (np.tanh(self.noise.last) if isinstance(self.noise, ColoredNoise)
                 else self.rng.uniform(-1.0, 1.0, self.act_dim).astype(np.float32))
            self.pstate = self.pstate._replace(prev_act=a)
        self._last_obs, self._last_action = x, a
        self.ticks += 1
        self.heartbeat.maybe_write(self.status)
        out = self._low + (a + 1.0) * self._half
        self._latency.add(time.perf_counter_ns() - t0)  # per-episode latency, for episodes.jsonl
        return out

    def observe(self, reward, next_obs, terminated, truncated, info: dict | None = None) -> None:
        """Record the outcome of the last act().  Ends the episode on terminated/truncated;
        a boolean ``info["won"]`` then is the episode's outcome."""
        if self._closed:
            raise AgentError("observe() after close()")
        self._enter("observe")
        try:
            self._observe(reward, next_obs, terminated, truncated, info)
        finally:
            self._calls.release()

    def _observe(self, reward, next_obs, terminated, truncated, info: dict | None) -> None:
        if info is not None and not isinstance(info, Mapping):
            raise MessageError(f"info must be a dict (or None), got {type(info).__name__}")
        if self._last_obs is None:
            raise AgentError("observe() needs a preceding act() in the same episode")
        # obs was checked in act() and the action came from the policy: only the new
        # values need checking, so the tick path validates each array once.
        try:
            r = check_reward(reward)
        except MessageError as e:
            if np.ndim(reward) > 0 or isinstance(reward, list | tuple):  # gymnasium's step order, (obs, reward, ...)
                raise MessageError(f"{e}; observe() takes (reward, next_obs, terminated, truncated, info), reward "
                                   "first: gymnasium's step() returns the observation first") from None
            raise
        tr = Transition(self._last_obs, self._last_action, r,
                        self._with_reward(self._check_obs(next_obs, "next_obs"), r),
                        check_flag("terminated", terminated), check_flag("truncated", truncated))
        self._last_obs = None
        self._prev_reward = r
        self._ep_return += tr.reward
        self._ep_len += 1
        self.env_steps += 1
        if self.learner is not None and not self._closed and self._episode_sent:
            if self.learning_starts_left > 0:
                self.learning_starts_left -= 1
            got = self._chain.send(self._put, tr)
            if got is None:
                self.gap_drops += 1  # the queue had no place for the marker either: dropped like a transition
            elif got:
                self.sent += 1
                if self.cfg.pace == "lockstep" and not (self.stop is not None and self.stop.is_set()):
                    # Not past a stop request: a close must not wait for a slow learner's pass.
                    self.learner.wait_processed(self.sent, timeout=600.0, stop=self.stop)
        elif self.learner is not None and not self._closed:
            self.unsent += 1  # its episode's start did not get through
        if tr.terminated or tr.truncated:
            self._end_episode(_outcome(info.get("won") if info else None))

    def keep_up(self, timeout: float = 600.0) -> bool:
        """Wait while the learner is more than half a queue of transitions behind (the ``learner``
        pace, which a driver of a simulated game calls between ticks: a game's own loop never
        calls it).  True if caught up; False in eval, with no learner, after ``stop``, or if the
        learner died or ``timeout`` ran out (the game then plays on)."""
        if self.learner is None or self._closed or (self.stop is not None and self.stop.is_set()):
            return False
        return self.learner.wait_caught_up(self.sent, max(1, self.cfg.queue_size // 2), timeout, self.stop)

    def new_episode(self, opponent: str = "") -> None:
        """Mark an episode start.  ``opponent`` is a stable identity key (name or id).
        The calling thread owns the episode: act()/observe() from another thread are refused."""
        if self._closed:
            raise AgentError("new_episode() after close()")
        self._enter("new_episode", claim=True)
        try:
            self._new_episode(opponent)
        finally:
            self._calls.release()

    def _new_episode(self, opponent) -> None:
        self.opponent = check_opponent(opponent)
        self.episodes_started += 1
        self.pstate = policy.initial_state(self.params)
        if isinstance(self.noise, ColoredNoise) and not self.eval_mode:
            self.noise.restart()  # here, between episodes, rather than inside the first act()
        self._last_obs = None
        self._prev_reward = 0.0
        self._ep_return, self._ep_len = 0.0, 0
        self._latency.reset()
        if self.learner is not None and not self._closed:
            # If even the reserved places are full (a learner minutes behind), this episode is not
            # sent at all: its transitions would otherwise be chained to the previous episode, or
            # skip an opponent change's clear.  Its drops are counted like the others.
            self._episode_sent = self.learner.send([NewEpisode(self.opponent)]) == 1
            self._chain = Chain(NewEpisode(self.opponent, gap=True))

    def _end_episode(self, won: bool | None) -> None:
        self.episodes += 1
        self.results[self.opponent].append(self._ep_return)
        self.recent.append((self._ep_return, won))
        outcome = {}
        if won is not None:
            self.wins[self.opponent].append(won)
            outcome = {"won": won}
        if self.rounds is not None:
            self.rounds.bump()
        if not self.eval_mode:
            append_jsonl(self.episodes_path, {"time": time.time(), "episode": self.episodes,
                                              "return": self._ep_return, "length": self._ep_len,
                                              "env_steps": self.env_steps,
                                              "opponent": self.opponent,
                                              "policy_version": self.policy_version, **outcome,
                                              **self._latency.summary_us()})
        self.pstate = policy.initial_state(self.params)
        self._prev_reward = 0.0  # a next act() without new_episode() starts a fresh episode too
        self._ep_return, self._ep_len = 0.0, 0
        self._latency.reset()

    def recent_stats(self) -> tuple[float | None, float | None]:
        """Mean return and win rate of the last 20 finished episodes (None when there are none,
        or, for the win rate, when the env reports no outcome)."""
        won = [w for _, w in self.recent if w is not None]
        return (float(np.mean([r for r, _ in self.recent])) if self.recent else None,
                float(np.mean(won)) if won else None)

    def _enter(self, what: str, claim: bool = False) -> None:
        """Take the one-caller lock (the caller releases it), refusing a call that overlaps another
        or comes from a thread other than the one that started the episode (``claim``: this call
        starts one and takes it over)."""
        me = threading.get_ident()
        if not self._calls.acquire(blocking=False):
            raise AgentError(f"{what}() called while another thread is inside act/observe/new_episode: "
                             "an Agent serves one game loop; give each loop its own Agent")
        if claim or self._owner is None:
            self._owner = me
        elif self._owner != me:
            self._calls.release()
            raise AgentError(f"{what}() from thread {threading.current_thread().name!r}, but this episode "
                             "was started by another thread: an Agent serves one game loop; give each "
                             "loop its own Agent (or call new_episode() from the new thread first)")

    def _put(self, msg) -> bool:
        """Offer one message to the learner's queue; never blocks."""
        return self.learner.send([msg]) == 1

    def _with_reward(self, x: np.ndarray, reward: float) -> np.ndarray:
        """The networks' input: the observation, then (``reward_input``) the previous reward."""
        return np.append(x, reward_feature(reward, self.cfg.reward_input_squash)) if self.cfg.reward_input else x

    def _check_obs(self, obs, name: str) -> np.ndarray:
        try:
            return check_vector(name, obs, self.obs_dim, shape=self.obs_shape, max_abs=MAX_ABS_OBS)
        except MessageError as e:
            raise MessageError(f"{e} (observation space shape {self.obs_shape}; "
                               "did the environment produce NaN/inf or the wrong shape?)") from None

    # --- status and shutdown --------------------------------------------------------
    @property
    def learner_error(self) -> str | None:
        if self.learner is None:
            return None
        return self.learner.status().learner_error

    def status(self) -> dict:
        """The heartbeat: the Agent's own counters and the status the learner last pushed (a plain
        dict; nothing here reads a live learner object, so this costs the acting thread a copy)."""
        st = {"pid": os.getpid(), "time": time.time(), "started": self.started,
              "mode": "eval" if self.eval_mode else "train", "ticks": self.ticks,
              "episodes": self.episodes, "policy_version": self.policy_version,
              "round_counter": self.rounds.value if self.rounds else None,
              "loaded_from": self.loaded_from, "learner": self.cfg.learner if self.learner else None}
        if self.learner is not None:
            ls = self.learner.status().to_dict()
            ls.pop("processed", None)
            ls.pop("policy_version_published", None)
            drops = {**self.learner.drops(), "save": ls.pop("save_drops", 0), "episode_not_started": self.unsent}
            drops["transition"] = drops.get("transition", 0) + self.gap_drops  # a full queue dropped those too
            st.update(ls, drops=drops)
        if self.final_save is not None:
            st["final_save"] = self.final_save
        return st

    def close(self, deadline: float | None = None) -> dict:
        """Stop sending; the learner ends the pass in progress (the steps left stay owed), takes
        what is queued into its buffer (untrained), makes the final save (blocking, guaranteed
        unless its state is not finite) and exits; free the weights directory.  Returns the final
        status, with ``final_save``.  ``deadline`` (by default ``cfg.final_save_timeout``) bounds it
        all: a learner that has not confirmed its save by then (stopped, or writing to a disk that
        hangs) is reported as ``final_save = {"ok": False, "timed_out": True, ...}``, and a
        learner process is killed, so the bot still exits on time."""
        if self._closed:
            return self.status()
        self._closed = True
        _OPEN.discard(self)
        if deadline is None:
            deadline = self.cfg.final_save_timeout
        if self.learner is not None:
            final = self.learner.close(json.dumps(self.rng.bit_generator.state), timeout=deadline)
            self.final_save = final.final_save or {"ok": False, "error": "the learner did not report"}
            if not final.learner_alive:
                self._release()  # a learner still writing keeps the lock: the OS frees it at exit
        st = self.status()
        self.heartbeat.maybe_write(lambda: st, force=True)
        self._run_claim.release()  # the last write to the run directory is done
        return st

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def claim_run_dir(cfg: Config) -> RunDirClaim:
    """The run directory, for this bot alone (sacbot/store/rundir.py).  Held by another bot: a setting
    to change, ConfigError (exit 2).  Held by this same bot (its weights path), which is running
    or still closing: AgentError (exit 1), as for its weights directory, so a runner retries."""
    claim = RunDirClaim(cfg.run_dir, cfg.weights_path)
    try:
        return claim.acquire()
    except RunDirInUse as e:
        if e.same_bot:
            raise AgentError(str(e)) from None
        raise ConfigError(str(e)) from None
    except OSError as e:  # read-only, a directory in the way: nothing of the run could be written there
        raise AgentError(f"--run-dir {cfg.run_dir!r} cannot be written ({claim.path!r}: {e.strerror or e}); "
                         "its status.json, episodes and metrics go there: pass a directory this bot may "
                         "write") from None


def _outcome(won) -> bool | None:
    """info["won"] read as terminated/truncated are (a bool, or 0/1); anything else is no outcome."""
    try:
        return check_flag("won", won)
    except MessageError:
        return None


# Agents not yet closed.  A program that ends without close() (a game that returns from main, a
# sys.exit) would otherwise lose everything since the last periodic save, and the training thread,
# still inside torch as the interpreter finalizes, aborts the process (SIGABRT).
_OPEN: set[Agent] = set()
# A forked child inherits the set but not the learners: closing its parent's Agents there would
# write the parent's status.json with the child's PID and fail its "final save".
if hasattr(os, "register_at_fork"):  # POSIX; Windows forks nothing
    os.register_at_fork(after_in_child=_OPEN.clear)


@atexit.register
def _close_forgotten() -> None:
    """At interpreter exit, after the main thread has returned: close every Agent the program did
    not, with its final save, and say so."""
    for agent in list(_OPEN):
        # A warning, not agent.log: a script that never configured logging still shows it.
        logging.getLogger("sacbot").warning(
            "an Agent was still open at exit; closing it now%s. Call close(), or use "
            "`with Agent(...) as agent:`, to close it where the game ends", "" if agent.eval_mode else " (final save)")
        try:
            agent.close()
        except Exception as e:  # noqa: BLE001 - the next Agent still gets its close
            logging.getLogger("sacbot").error("closing an Agent at exit failed: %s: %s", type(e).__name__, e)
