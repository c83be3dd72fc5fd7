"""Gymnasium driver: runs an Agent on any env with a Box action space.

Pace modes:

* ``free``: as fast as the env and the acting thread go.
* ``realtime``: ticks on a fixed clock at ``tps``; a tick that starts after its
  deadline counts as a miss (a game server would have moved on).
* ``lockstep``: the agent waits after each step until the learner has done the UTD
  steps owed, so runs are reproducible and comparable with synchronous libraries.

Usage::

    report = drive(cfg, stop=threading.Event())
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from functools import partial

import gymnasium as gym

from .agent import Agent, AgentError
from .config import Config, ConfigError, log
from .progress import Progress


def make_env(env_id: str, render_mode: str | None = None, kwargs: dict | None = None) -> gym.Env:
    from . import envs  # noqa: F401 - registers sacbot's envs (the repo's envs/, installed as sacbot.envs)

    # render_mode only when asked for: gymnasium passes even None on to the env's constructor,
    # and an env written without a render_mode argument would fail on it.
    extra = {} if render_mode is None else {"render_mode": render_mode}
    try:
        env = gym.make(env_id, **extra, **(kwargs or {}))
    except (gym.error.Error, TypeError, ValueError) as e:
        raise AgentError(f"cannot make env {env_id!r} with kwargs {kwargs or {}}: {e}") from None
    return flatten_if_nested(env)


def with_env_critic_obs(cfg: Config, env: gym.Env) -> Config:
    """``cfg`` with the env's own count of critic-only observation values (its ``critic_obs``
    attribute, as sacbot/TankDuelRadar-v1 declares): an actor that read them would see what the
    game hides from the player, so the env's word is not left to a flag.  An env whose reward is
    computed from hidden state (its ``privileged_reward`` attribute: TankDuel's shaping) refuses
    reward_input, which would hand that reward to the actor as an input."""
    if cfg.reward_input and getattr(env.unwrapped, "privileged_reward", False):
        raise ConfigError(f"reward_input = True, but {cfg.env}'s reward is computed from state the actor must not see "
                          "(its privileged_reward): as an input it would tell the actor what the game hides; turn "
                          "reward_input off")
    declared = getattr(env.unwrapped, "critic_obs", 0)
    if not cfg.critic_memory and not cfg.memoryless and not (declared or cfg.critic_obs) and not cfg.eval_mode:
        # TankDuelRadar-v1's preset turns the critic's memory off because the env gives it the hidden
        # state; with critic_info off the critic would learn from neither (a partial view alone).
        log.warning("critic_memory is off, but %s gives the critic no values of its own (critic_obs 0): the "
                    "critic sees neither the history nor the hidden state; pass --critic-memory if the "
                    "game hides state", cfg.env)
    if not declared or cfg.critic_obs == declared:
        return cfg
    if cfg.critic_obs:
        raise ConfigError(f"critic_obs = {cfg.critic_obs}, but {cfg.env} declares its last {declared} observation "
                          f"values critic-only; leave critic_obs unset (or {declared})")
    log.info("%s declares its last %d observation values critic-only: the actor never reads them "
             "(critic_obs=%d)", cfg.env, declared, declared)
    return dataclasses.replace(cfg, critic_obs=declared)


def env_layout(env: gym.Env) -> dict | None:
    """The values of the kwargs the env declares change what its observations or actions mean
    (its ``layout_kwargs``, e.g. TankDuel's gun_control), or None if it declares none.  Saved with
    the bot, so that a resume or eval under other values is refused (Config.transfer).  As JSON
    gives them back (a tuple as a list, an odd object as its repr), so a saved layout compares
    equal to the same one made again."""
    keys = getattr(env.unwrapped, "layout_kwargs", ())
    layout = {k: getattr(env.unwrapped, k) for k in keys}
    return json.loads(json.dumps(layout, default=repr)) if layout else None


def saved_layout(saved_cfg: dict) -> dict | None:
    """The layout a checkpoint from before ``env_layout`` was saved (or a pretrained bot) was
    trained under: its env made again with its saved id and kwargs.  None if it cannot be."""
    try:
        kwargs = json.loads(saved_cfg.get("env_kwargs") or "{}")
        env = make_env(saved_cfg["env"], kwargs=kwargs if isinstance(kwargs, dict) else {})
    except Exception:  # noqa: BLE001 - an env that no longer makes is not compared, as before the field
        return None
    try:
        return env_layout(env)
    finally:
        env.close()


def flatten_if_nested(env: gym.Env) -> gym.Env:
    """Dict and Tuple observations reach the agent flattened into one Box."""
    if isinstance(env.observation_space, gym.spaces.Dict | gym.spaces.Tuple):
        env = gym.wrappers.FlattenObservation(env)
    return env


def _progress_text(agent: Agent, steps: int) -> str:
    ret, won = agent.recent_stats()
    ls = agent.learner.status() if agent.learner else {}
    st = ls.get("grad_steps_per_s", 0.0)
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


def drive(cfg: Config, stop: threading.Event | None = None, agent_log=None, learner=None) -> dict:
    """Play until --steps, --episodes or ``stop``; close the agent (final save); report.
    ``learner``: a learner handle to feed instead of one of the bot's own (a shared Ray learner)."""
    stop = stop or threading.Event()
    env = make_env(cfg.env, kwargs=cfg.env_kwargs_dict())
    try:
        cfg = with_env_critic_obs(cfg, env)
        # The stop request reaches the Agent's own waits: the learner's start, lockstep's wait.
        agent = Agent(cfg, env.observation_space, env.action_space, log=agent_log, learner=learner,
                      env_layout=env_layout(env), stop=stop)
    except BaseException:  # the Agent left nothing behind; neither does the env
        env.close()
        raise
    progress = Progress(not cfg.quiet, cfg.steps or None)
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
                steps += 1
                ticks += 1
                done = terminated or truncated
                progress.update(steps, partial(_progress_text, agent, steps))
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



