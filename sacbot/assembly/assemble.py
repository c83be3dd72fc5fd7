"""Where a bot is put together: the only module that knows both the acting and the learning side.

    start = assemble(cfg, obs_dim, act_dim, spaces, logger)   # called by Agent.__init__
    start.arrays          # the actor the bot plays first (plain arrays)
    start.learner         # a Learner (sacbot.wire.boundary), or None in eval mode
    start.release()       # at close: frees the weights directory's writer lock
    start.abort()         # instead, if the bot fails to start: learner ended unsaved, lock freed

It decides between the four ways a bot starts:

* **eval**: the newest checkpoint's actor export, read alone (no learner, nothing written);
* **pretrained**: eval with no checkpoint of one's own plays the bot shipped for the env;
* **resume**: the newest checkpoint that verifies (bad files are set aside, never deleted);
* **fresh**: nothing to resume.

A start is all or nothing: whatever fails (or is interrupted by ``stop``, or by a
KeyboardInterrupt) after the lock is taken or the learner started ends that learner without a save
(its threads joined and its process reaped, within a deadline) and frees the lock before the
error goes on; a caller that fails after ``assemble`` returned calls ``start.abort()``.

Everything here reads files and plain data; torch is imported only by the learner, and only when
training: ``sacbot.learning.thread_learner`` is imported here lazily, and ``sacbot.learning.process_learner``'s
parent side never imports it at all.
"""

from __future__ import annotations

import logging
import os
import threading

from sacbot.config import Config, ConfigError
from sacbot.console import SILENT, Log
from sacbot.store.errors import CheckpointError, CheckpointMismatch, CheckpointStop
from sacbot.store.files import UnusableDir, make_dir
from sacbot.store.format import MAX_CHECKPOINT_BYTES, checkpoint_byte_cap
from sacbot.store.load import load_latest
from sacbot.store.lock import LockHeld, WriterLock
from sacbot.store.weights_dir import candidates, check_latest_name, remove_stale_temps
from sacbot.wire.boundary import LearnerSpec, Start, StartError, StartInterrupted

ABORT_TIMEOUT_S = 30.0  # for a learner ended by a failed start: its threads and process to stop
READY_TIMEOUT_S = 300.0  # for a learner to build itself and publish its first actor


def _weights_dir(cfg: Config) -> None:
    try:
        make_dir(cfg.weights_dir, "--weights-path")
    except UnusableDir as e:
        raise StartError(str(e)) from None


def _mismatch(cfg: Config, e: Exception) -> ConfigError:
    moved = getattr(e, "set_aside", [])
    done = (f"Nothing in {cfg.weights_dir!r} was changed." if not moved else
            f"No checkpoint in {cfg.weights_dir!r} was written or overwritten; only damaged files were kept "
            f"aside: {', '.join(os.path.basename(p) for p in moved)}.")
    return ConfigError(f"{e}. To go on with that bot, run with its settings (`sacbot inspect` shows them; the "
                       "sacbot commands take those that shape its networks from the bot when none is given); "
                       f"for a new bot, pass another --weights-path. {done}")


def _stopped(cfg: Config, e: CheckpointError) -> StartError:
    """A checkpoint that is not proven bad but cannot be used now (a newer format, unreadable, step
    files newer than the newest): the run stops and says what was left as it was."""
    moved = getattr(e, "set_aside", [])
    done = (f"Nothing in {cfg.weights_dir!r} was changed." if not moved else
            f"No checkpoint in {cfg.weights_dir!r} was written or overwritten; only damaged files were kept "
            f"aside: {', '.join(os.path.basename(p) for p in moved)}.")
    return StartError(f"{e}. {done}")


def assemble(cfg: Config, obs_dim: int, act_dim: int, spaces: dict, logger: Log,
             learner=None, stop: threading.Event | None = None) -> Start:
    """``stop``: the bot's stop request; set while the learner starts, the start is given up
    (StartInterrupted) at once instead of after the learner is ready."""
    if cfg.eval_mode:
        return _eval(cfg, obs_dim, act_dim, spaces, logger)
    if learner is not None:
        return _attach(cfg, learner, obs_dim, act_dim, stop)
    return _train(cfg, obs_dim, act_dim, spaces, logger, stop)


def _interrupted(what: str) -> StartInterrupted:
    return StartInterrupted(f"the start was interrupted (a stop was requested while {what}); nothing was "
                            "saved and nothing of this bot is left running")


def _attach(cfg: Config, learner, obs_dim: int, act_dim: int, stop: threading.Event | None = None) -> Start:
    """A bot that feeds a learner someone else runs (and saves): it writes no weights, takes no
    lock, and starts from the learner's newest actor."""
    theirs = learner.spaces() if hasattr(learner, "spaces") else None
    if theirs is not None and tuple(theirs) != (obs_dim, act_dim):
        raise StartError(f"this game's spaces (obs_dim {obs_dim}, act_dim {act_dim}) are not the learner's "
                            f"(obs_dim {theirs[0]}, act_dim {theirs[1]}): join a learner of this env, with the "
                            f"same reward_input (here {cfg.reward_input}: it adds one input)")
    # A learner of the caller's may predate ``stop`` in the boundary: it is passed only when there is one.
    if not (learner.wait_ready(READY_TIMEOUT_S, stop) if stop is not None else learner.wait_ready(READY_TIMEOUT_S)):
        if stop is not None and stop.is_set():
            raise _interrupted("waiting for the learner's first actor")
        raise StartError(f"the learner did not publish an actor in {READY_TIMEOUT_S:g} s "
                            f"({learner.status().last_error})")
    got = learner.pull(0)
    assert got is not None
    version, arrays = got
    st = learner.status()
    return Start({k: v.copy() for k, v in arrays.items()}, version, None, learner,
                 env_steps=int(st.env_steps_received))


# --- eval ------------------------------------------------------------------------------------
def _eval(cfg: Config, obs_dim: int, act_dim: int, spaces: dict, logger: Log) -> Start:
    # The export carries its own sizes; of the settings only the inputs must agree (and naming
    # reward_input says why a wider input is asked for; critic_obs, which values the actor reads),
    # and the game: a bot played in another one would read its values as something else.
    expect = {"obs_dim": obs_dim, "act_dim": act_dim, "reward_input": cfg.reward_input,
              "reward_input_squash": cfg.reward_input_squash, "critic_obs": cfg.critic_obs,
              **_game(cfg, spaces)}
    try:
        # Actor-only: eval reads the deployable actor export and the manifest, nothing else.
        # Eval writes nothing, so the newest checkpoint is played even with newer step files beside it.
        found = load_latest(cfg.weights_dir, expect, entries=("actor",), logger=logger, set_aside_bad=False,
                               latest_name=cfg.latest_name, refuse_newer_steps=False)
    except CheckpointMismatch as e:
        raise _mismatch(cfg, e) from None
    except CheckpointStop as e:
        raise _stopped(cfg, e) from None
    if found is None and cfg.weights_path == Config.weights_path:
        found = _pretrained(cfg, expect, logger)
    if found is None:
        raise StartError(f"no valid checkpoint in {cfg.weights_path!r} to evaluate; "
                            "train first with `sacbot run` or pass --weights-path")
    ckpt, path = found
    arrays = {k[len("export."):]: v for k, v in ckpt["arrays"].items() if k.startswith("export.")}
    return Start(arrays, int(ckpt["manifest"].get("step", 0)), path)


def _game(cfg: Config, spaces: dict | None) -> dict:
    """What ``checkpoint.game_difference`` compares: the env id, the env's layout kwargs (when
    the caller gave them; for a checkpoint saved without them, derived from its env and kwargs),
    and whether --transfer lets a bot of another game go on."""
    out = {"env": cfg.env, "transfer": cfg.transfer}
    if spaces and spaces.get("env_layout"):
        from sacbot.acting.games import saved_layout  # gymnasium: only when the env declared a layout

        out.update(env_layout=spaces["env_layout"], layout_of=saved_layout)
    return out


def expect_for(cfg: Config, obs_dim: int, act_dim: int, spaces: dict | None = None) -> dict:
    """What a checkpoint must fit for this run to go on training it (checkpoint.check_shapes): the
    sizes, the settings that shape the learner, and the game.  Shared by the bot's own learner,
    ``sacbot cluster``'s up-front check and the Ray learner."""
    return {**cfg.to_dict(), "obs_dim": obs_dim, "act_dim": act_dim, **_game(cfg, spaces)}


def _pretrained(cfg: Config, expect: dict, logger: Log):
    """No checkpoint of one's own: play a pretrained bot for this env (one in
    <weights>/pretrained/, else the one shipped in the package), saying so."""
    from sacbot.store import pretrained
    found = pretrained.find(cfg.env, expect, logger, cfg.weights_path)
    if found:
        logger.info(f"no checkpoint of your own in {cfg.weights_path!r}; evaluating the pretrained bot "
                    f"{found[1]} (provenance in {pretrained.provenance(found[1])})")
    return found


# --- training ---------------------------------------------------------------------------------
def check_settings(cfg: Config, obs_dim: int, act_dim: int) -> None:
    """What a learner would refuse, found before any file exists: checkpoints over the read cap,
    a GPU that is not there.  (``sacbot cluster`` runs it in its driver too.)"""
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the base install acts; only a learner needs torch
        raise ConfigError("training needs torch, which is not installed here: pip install 'sacbot[train]' "
                          "(acting, eval and inspect need no torch; `sacbot eval` plays a bot without it)")
    if cfg.critic_obs >= obs_dim:
        raise ConfigError(f"critic_obs = {cfg.critic_obs} would leave the actor none of the observation's {obs_dim} "
                          "values; it counts the last values only the critic reads")
    from sacbot.learning.memory import check_memory

    check_memory(cfg, obs_dim, act_dim)  # combinations that cannot fit this machine, before the first allocation
    need = checkpoint_byte_cap(obs_dim, act_dim, cfg.hidden, cfg.buffer_size, cfg.save_replay)
    if need > MAX_CHECKPOINT_BYTES:  # its checkpoints could never be written, nor read back
        raise ConfigError(f"hidden = {cfg.hidden} with buffer_size = {cfg.buffer_size} makes checkpoints of up to "
                          f"{need:,} bytes, over sacbot's cap of {MAX_CHECKPOINT_BYTES:,} (bounded reads, "
                          "docs/design.md): lower --buffer-size, or pass --no-save-replay")
    if cfg.device != "cpu":
        from sacbot.learning.sac import resolve_device  # torch, here only because a GPU was asked for

        resolve_device(cfg.device)


def check_weights_dir(cfg: Config, obs_dim: int, act_dim: int, spaces: dict | None = None) -> None:
    """For a learner that another process will start (a Ray actor): the directory is free, and its
    newest readable checkpoint fits these settings and this game (``spaces``).  Changes no file."""
    _weights_dir(cfg)
    _lock(cfg).close()
    _check_loadable(cfg, obs_dim, act_dim, spaces)


def _check_loadable(cfg: Config, obs_dim: int, act_dim: int, spaces: dict | None) -> None:
    """The newest readable checkpoint fits these settings, and with --no-fresh-start one loads.
    Reads only the actors and moves nothing aside, so a refusal leaves every file where it was."""
    try:
        found = load_latest(cfg.weights_dir, expect_for(cfg, obs_dim, act_dim, spaces),
                               entries=("actor",), logger=SILENT, set_aside_bad=False,
                               latest_name=cfg.latest_name)
        has_files = bool(candidates(cfg.weights_dir, cfg.latest_name))
    except CheckpointMismatch as e:
        raise _mismatch(cfg, e) from None
    except CheckpointStop as e:
        raise _stopped(cfg, e) from None
    if found is None and cfg.no_fresh_start and has_files:
        raise StartError(f"no checkpoint in {cfg.weights_dir!r} loads, and --no-fresh-start refuses to start "
                            "fresh; nothing there was moved or changed")


def _lock(cfg: Config) -> WriterLock:
    """The weights directory's writer lock, taken, or an StartError that says why not."""
    lock = WriterLock(cfg.weights_dir)
    try:
        return lock.acquire()
    except LockHeld as e:
        raise StartError(str(e)) from None
    except OSError as e:  # a directory in the lock file's place, no permission
        why = "a directory is in the way" if os.path.isdir(lock.path) else e.strerror
        raise StartError(f"--weights-path {cfg.weights_dir!r}: cannot open its writer lock {lock.path!r}: "
                            f"{why}") from None


def _train(cfg: Config, obs_dim: int, act_dim: int, spaces: dict, logger: Log,
           stop: threading.Event | None = None) -> Start:
    try:  # its step files would be another bot's, or its own would overwrite it
        check_latest_name(cfg.latest_name)
    except ValueError as e:
        raise ConfigError(f"weights_path = {cfg.weights_path!r} is not accepted for training: {e}") from None
    check_settings(cfg, obs_dim, act_dim)
    _weights_dir(cfg)
    lock = _lock(cfg)  # one writer per weights directory, held until close (the OS frees it on any exit)
    try:
        return _train_locked(cfg, obs_dim, act_dim, spaces, logger, lock, stop)
    except BaseException:
        lock.close()
        raise


def abort_learner(learner, timeout: float = ABORT_TIMEOUT_S) -> None:
    """End a learner whose bot failed to start: no final save, its threads and process gone
    within ``timeout`` (said in the log if not; an exception here must not hide the start's)."""
    try:
        learner.abort(timeout)
    except Exception as e:  # noqa: BLE001 - the caller raises the failure that brought us here
        logging.getLogger("sacbot").error("ending the learner of a failed start: %s: %s", type(e).__name__, e)


def _train_locked(cfg, obs_dim, act_dim, spaces, logger: Log, lock: WriterLock, stop=None) -> Start:
    for p in remove_stale_temps(cfg.weights_dir):  # safe: we hold the lock
        logger.info(f"removed stale temp file {p}")
    try:
        had_files = bool(candidates(cfg.weights_dir, cfg.latest_name))
        # With --no-fresh-start nothing is set aside: a refusal must leave every file where it was,
        # or the next plain run would start fresh without the warning.
        found = load_latest(cfg.weights_dir, expect_for(cfg, obs_dim, act_dim, spaces),
                               logger=logger, latest_name=cfg.latest_name, set_aside_bad=not cfg.no_fresh_start)
    except CheckpointMismatch as e:
        raise _mismatch(cfg, e) from None
    except CheckpointStop as e:
        raise _stopped(cfg, e) from None
    if found is None and had_files:
        if cfg.no_fresh_start:
            raise StartError(f"no checkpoint in {cfg.weights_dir!r} loads, and --no-fresh-start refuses to start "
                                "fresh; nothing there was moved or changed")
        logger.warning("no valid checkpoint could be loaded; STARTING FRESH. The unusable files are kept aside "
                       "as *.corrupt-*.")
    ckpt, path = found if found is not None else (None, None)
    spec = LearnerSpec(config=cfg.to_dict(), obs_dim=obs_dim, act_dim=act_dim, spaces=spaces,
                       metrics_path=cfg.metrics_path, weights_dir=cfg.weights_dir, latest_name=cfg.latest_name)
    learner = _start_learner(cfg, spec, ckpt, path, lock, stop)
    try:
        meta = ckpt["meta"] if ckpt is not None else {}
        got = learner.pull(0)
        assert got is not None  # _start_learner waited for the first publish
        version, arrays = got

        def abort() -> None:
            abort_learner(learner)
            lock.close()

        return Start({k: v.copy() for k, v in arrays.items()}, version, path, learner,
                     env_steps=int(meta.get("env_steps", 0)), episodes=int(meta.get("episodes", 0)),
                     acting_rng=meta.get("acting_rng"), release=lock.close, abort=abort)
    except BaseException:
        abort_learner(learner)
        raise


def _start_learner(cfg: Config, spec, ckpt: dict | None, path: str | None, lock: WriterLock, stop=None):
    if cfg.learner == "process":
        from sacbot.learning.process_learner import ProcessLearner

        # The child takes the directory's lock itself: it writes there, and it may outlive us.
        lock.close()
        learner = ProcessLearner(spec, path, cfg.queue_size, pace=cfg.pace)
    else:
        from sacbot.learning.thread_learner import ThreadLearner

        learner = ThreadLearner(spec, ckpt, cfg.queue_size)
    try:
        ready = learner.wait_ready(READY_TIMEOUT_S, stop) and learner.snapshot.version > 0
    except BaseException:  # a KeyboardInterrupt while waiting
        abort_learner(learner)
        raise
    if not ready:
        st = learner.status()
        abort_learner(learner)
        if stop is not None and stop.is_set() and st.learner_alive:
            raise _interrupted("the learner was starting")
        err = st.start_error or st.last_error or f"the learner did not start in {READY_TIMEOUT_S:g} s"
        if st.start_error_kind == "config":
            raise ConfigError(f"{err}. Nothing in {cfg.weights_dir!r} was changed.")
        if cfg.learner == "process" and not st.start_error and learner.proc.exitcode == 1:
            # The child failed before it said anything.  Under spawn it imports the main module again: a
            # script without the main guard runs its game (and this Agent) a second time in the child.
            err = ("the learner process exited with code 1 before it started. If the script makes this Agent at "
                   "import time, the child process ran it again: with learner='process', make the Agent under "
                   "`if __name__ == \"__main__\":`")
        raise StartError(f"the learner could not start: {err}")
    return learner
