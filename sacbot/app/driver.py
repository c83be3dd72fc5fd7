"""Gymnasium driver: runs an Agent on any env with a Box action space.

Pace modes:

* ``learner`` (the default): as fast as the learner keeps up.  Between ticks, not inside
  ``act``, the driver waits while more than half a queue of transitions waits for its updates,
  so nothing is dropped and every transition gets its UTD steps; a fast learner never slows it.
* ``free``: as fast as the env and the acting thread go; what the learner cannot take is dropped.
* ``realtime``: ticks on a fixed clock at ``tps``; a tick that starts after its
  deadline counts as a miss (a game server would have moved on).
* ``lockstep``: the agent waits after each step until the learner has done the UTD
  steps owed, so runs are reproducible and comparable with synchronous libraries.

Usage::

    report = drive(cfg, stop=threading.Event())
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from functools import partial

import gymnasium as gym

from sacbot.acting.games import env_layout, make_env, with_env_critic_obs
from sacbot.app.progress import Progress
from sacbot.assembly.bot import Agent
from sacbot.config import Config
from sacbot.store.atomic import atomic_write_text

log = logging.getLogger("sacbot")
DROP_WARN_FRACTION = 0.10  # of the transitions played: past it the learner is not learning from the run
DROP_CHECK_EVERY = 1000  # env steps between looks at the drop count (a status copy each)


def _progress_text(agent: Agent, steps: int) -> str:
    ret, won = agent.recent_stats()
    st = agent.learner.status().grad_steps_per_s if agent.learner else 0.0
    drops = agent.learner.drops()["transition"] if agent.learner else 0
    return (f"steps {steps}  ret(avg20) {'     n/a' if ret is None else f'{ret:8.1f}'}"
            + ("" if won is None else f"  won(last20) {won:4.0%}")
            + f"  grad/s {st:6.1f}  v{agent.policy_version}  drops {drops}")


def _each_opponent_done(env: gym.Env, agent: Agent, n: int) -> bool:
    """Every opponent the env can schedule (``env.unwrapped.opponents`` when it has them, else
    those met so far) has finished ``n`` episodes."""
    names = getattr(env.unwrapped, "opponents", None) or list(agent.results) or [""]
    return all(len(agent.results.get(str(o), [])) >= n for o in names)


def _wait_for_tick(stop: threading.Event, at: float) -> bool:
    """Sleep until perf_counter() reaches ``at``; True as soon as ``stop`` is set.  In slices of at
    most 0.5 s: CPython runs a signal handler only between bytecodes, so a SIGTERM that lands just
    before the main thread blocks in Event.wait is not seen until the wait ends, and at 0.05 ticks/s
    that was once a 20 s close (test_sigterm_closes_promptly_in_every_pace_with_a_final_save)."""
    while (left := at - time.perf_counter()) > 0:
        if stop.wait(min(left, 0.5)):
            return True
    return stop.is_set()


def write_resolved_config(cfg: Config) -> str | None:
    """``run_dir/config.toml``: every setting as this run resolved it (defaults, preset, TOML, env,
    flags), so a run can be repeated with ``--config``.  None, with a warning, if it cannot be
    written: a run does not stop for it."""
    path = os.path.join(cfg.run_dir, "config.toml")
    lines = ["# The settings this run resolved; `sacbot run --config` with this file repeats them.", "[sacbot]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in cfg.to_dict().items()]  # JSON's str/num/bool are TOML's
    try:
        atomic_write_text(path, "\n".join(lines) + "\n", durable=False)
    except OSError as e:
        log.warning("could not write %s (%s); the run goes on", path, e.strerror or e)
        return None
    return path


def dropped_share(agent: Agent) -> tuple[int, float]:
    """Transitions the learner did not get (dropped by a full queue), and their share of those played."""
    drops = (agent.status().get("drops") or {}).get("transition", 0)
    return drops, drops / max(agent.env_steps_played, 1)


def _warn_if_starved(agent: Agent, cfg: Config) -> bool:
    """True once it has warned: a run that drops over a tenth of what it plays trains on a sample
    of the game it did not choose, and only the progress line said so."""
    drops, share = dropped_share(agent)
    if share <= DROP_WARN_FRACTION:
        return False
    log.warning("the learner is not keeping up: %d of %d transitions (%.0f%%) were dropped so far at "
                "--pace %s; use --pace learner (the default: the bot waits while the learner is behind), "
                "--pace realtime --tps N, or a lower --utd-ratio", drops, agent.env_steps_played, 100 * share, cfg.pace)
    return True


def drive(cfg: Config, stop: threading.Event | None = None, agent_logger=None, learner=None) -> dict:
    """Play until --steps, --episodes or ``stop``; close the agent (final save); report.
    ``learner``: a learner handle to feed instead of one of the bot's own (a shared Ray learner)."""
    stop = stop or threading.Event()
    env = make_env(cfg.env, kwargs=cfg.env_kwargs_dict())
    try:
        cfg = with_env_critic_obs(cfg, env)
        # The stop request reaches the Agent's own waits: the learner's start, lockstep's wait.
        agent = Agent(cfg, env.observation_space, env.action_space, logger=agent_logger, learner=learner,
                      env_layout=env_layout(env), stop=stop)
    except BaseException:  # the Agent left nothing behind; neither does the env
        env.close()
        raise
    if not cfg.eval_mode:
        write_resolved_config(cfg)
    progress = Progress(not cfg.quiet, cfg.steps or None)
    warned = cfg.eval_mode or learner is not None  # a shared learner's drops are its cluster's to report
    period = 1.0 / cfg.tps
    misses = ticks = 0
    next_tick = time.perf_counter()
    steps = 0
    limit_reached = False
    try:
        while not stop.is_set():
            # One seed per episode, from the run's episode count (restored on resume), so a
            # resumed run plays exactly the episodes an uninterrupted one would.
            k = agent.episode_index
            obs, info = env.reset(seed=cfg.seed + k, options={"episode_index": k})
            agent.new_episode(str(info.get("opponent", "")))
            done = False
            # A signal closes within a tick in every pace, lockstep included (which then ends
            # mid-episode: the resumed run starts a new one).  A run that must resume bit for
            # bit stops at an episode boundary with --steps or --episodes instead.
            while not done and not limit_reached and not stop.is_set():
                if cfg.pace == "realtime":
                    now = time.perf_counter()
                    if now > next_tick + period:
                        misses += 1  # this tick starts after its deadline
                        next_tick = now
                    elif _wait_for_tick(stop, next_tick):  # a slow clock must not delay a close
                        break
                    next_tick += period
                action = agent.act(obs)
                obs, reward, terminated, truncated, info = env.step(action)
                agent.observe(reward, obs, terminated, truncated, info)
                if cfg.pace == "learner":
                    agent.keep_up()
                steps += 1
                ticks += 1
                done = terminated or truncated
                progress.update(steps, partial(_progress_text, agent, steps))
                if not warned and steps % DROP_CHECK_EVERY == 0:
                    warned = _warn_if_starved(agent, cfg)
                if cfg.steps and steps >= cfg.steps:
                    limit_reached = True
                    stop.set()
                if agent.learner_error is not None:
                    # A training run whose learner died would only play on without learning;
                    # end it so the exit code (1) tells a runner to restart from the last save.
                    stop.set()
            if cfg.episodes and agent.episodes >= cfg.episodes:
                break
            if cfg.episodes_per_opponent and _each_opponent_done(env, agent, cfg.episodes_per_opponent):
                break
    finally:
        progress.close()
        env.close()
        final = agent.close()
    ret, won = agent.recent_stats()
    final.update(env_steps=steps, deadline_misses=misses, ticks=ticks, mean_return_last20=ret, win_rate_last20=won)
    final["agent"] = agent
    return final



