"""``sacbot cluster``: N bots on Ray feeding one learner, with one progress line and one status.

    sacbot cluster --bots 4 --steps 50000                 # a local Ray instance of its own
    sacbot cluster --bots 4 --address auto                # join a running cluster
    sacbot status runs/cluster                            # the cluster's heartbeat

Files: ``ROOT/status.json`` (the cluster heartbeat, once a second), ``ROOT/bot<i>/run/`` (each bot's
status.json and episodes.jsonl), ``ROOT/bot<i>/round_counter.txt`` (each bot's liveness),
``ROOT/learner/training_metrics.jsonl``, and the checkpoints in ``--weights-path``, written by the
learner alone.  SIGINT/SIGTERM stops every bot, then the learner makes its final save.
A bot whose round counter stops moving for ``--freeze-timeout`` s is killed and Ray restarts it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import socket
import threading
import time

from sacbot.app.ray_client import NAMESPACE, require_ray
from sacbot.app.ray_cluster import bot_actor, learner_actor
from sacbot.config import Config, ConfigError
from sacbot.store.liveness import Heartbeat, read_round_counter
from sacbot.wire.boundary import LearnerSpec

log = logging.getLogger("sacbot")
POLL_S = 0.5


@dataclasses.dataclass
class ClusterArgs:
    bots: int = 2
    address: str | None = None  # None: start a local Ray instance
    root: str = "runs/cluster"
    learner_cpus: float = 1.0
    learner_gpus: float = 0.0
    bot_cpus: float = 1.0
    freeze_timeout: float = 0.0  # 0: off


def bot_config(cfg: Config, i: int, root: str) -> Config:
    """Bot ``i``'s settings: its own seed and files; quiet (the cluster draws the one progress line)."""
    d = os.path.join(root, f"bot{i}")
    # A training bot writes no weights: its "weights path" only places its round counter.  An eval
    # bot reads the learner's checkpoints (and writes nothing).
    return dataclasses.replace(cfg, seed=cfg.seed + 1000 * i, run_dir=os.path.join(d, "run"),
                               weights_path=os.path.abspath(cfg.weights_path) if cfg.eval_mode else d,
                               quiet=True, tensorboard="")


def check(cfg: Config, a: ClusterArgs) -> None:
    if a.bots < 1:
        raise ConfigError(f"--bots = {a.bots} is not accepted: expected an integer >= 1")
    if cfg.pace == "lockstep":
        raise ConfigError("pace = 'lockstep' is not accepted by sacbot cluster: bots never wait for a shared "
                          "learner's step-by-step updates; use learner (the default: each bot waits while the "
                          "learner is behind), free or realtime")
    for name in ("learner_cpus", "learner_gpus", "bot_cpus", "freeze_timeout"):
        v = getattr(a, name)
        if not math.isfinite(v) or v < 0 or (name == "bot_cpus" and v > 1024):
            raise ConfigError(f"--{name.replace('_', '-')} = {v} is not accepted: expected a finite number >= 0")


def run_cluster(cfg: Config, a: ClusterArgs, stop: threading.Event) -> int:
    check(cfg, a)
    unreachable = prepare_address(a.address)
    if unreachable:
        log.error("cannot join the Ray cluster at %r: %s", a.address, unreachable)
        return 1
    ray = require_ray()
    from sacbot.app.envcheck import check_env

    check_env(cfg)
    from sacbot.acting.games import env_layout, make_env, with_env_critic_obs

    env = make_env(cfg.env, kwargs=cfg.env_kwargs_dict())
    cfg = with_env_critic_obs(cfg, env)
    from sacbot.acting.spaces import input_dim, learner_spaces, space_dims

    obs_dim, act_dim = space_dims(env.observation_space, env.action_space)
    obs_dim = input_dim(cfg, obs_dim)  # what the learner sees
    spaces = learner_spaces(obs_dim, env.observation_space, env.action_space, env_layout(env))
    if not cfg.eval_mode:  # what the learner actor would refuse, said here (exit 2 or 1), not as a Ray trace
        from sacbot.assembly.assemble import check_settings, check_weights_dir

        check_settings(cfg, obs_dim, act_dim)
        check_weights_dir(cfg, obs_dim, act_dim, spaces)
    env.close()
    os.makedirs(a.root, exist_ok=True)
    init = dict(namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    # ray.init installs a SIGTERM handler that ends the driver at once: put ours back, so a
    # SIGTERM stops the bots and makes the learner's final save like SIGINT does.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for attempt in (1, 2):
        try:
            if a.address:
                ray.init(address=a.address, **init)
            else:
                ray.init(num_cpus=max(2, int(a.learner_cpus + a.bots * a.bot_cpus + 0.999)), **init)
            break
        except Exception as e:  # noqa: BLE001 - Ray's ConnectionError and friends: one line, not a trace
            # Ray gives a local raylet a fixed 30 s to register; on a machine whose every core is busy it
            # can take longer (seen once in a test run on 2 loaded cores): a second try usually finds it.
            if attempt == 1 and not a.address and "timed out during startup" in str(e):
                log.warning("a local Ray instance did not start within Ray's 30 s (a busy machine?); trying "
                            "once more")
                ray.shutdown()
                continue
            where = f"join the Ray cluster at {a.address!r}" if a.address else "start a local Ray instance"
            msg = str(e).strip()
            log.error("cannot %s: %s", where, msg.splitlines()[-1][:300] if msg else type(e).__name__)
            return 1
    for s, h in handlers.items():
        signal.signal(s, h)
    try:
        _check_resources(ray, a, cfg.eval_mode)
        return _run(ray, cfg, a, stop, obs_dim, act_dim, spaces)
    finally:
        ray.shutdown()


def prepare_address(address: str | None) -> str | None:
    """Before Ray is imported: set what a local or loopback address needs, and say why nothing can
    answer at ``address`` (None when something may: it is empty for a local instance, ``auto``,
    or something accepts a connection there).  Ray retries a dead address for minutes, printing
    C++ warnings, before it gives up; this says so at once.  (``tools/join_cluster.py`` uses it too.)"""
    if not address or address.startswith(("127.", "localhost", "ray://127.", "ray://localhost")):
        # A local instance listens on the loopback address only, so nothing outside this machine
        # can reach it.  Ray reads this when it is imported: with it off, Ray takes 127.0.0.1 as the
        # node's address instead of the address other machines would use (and, joining, rewrites
        # 127.0.0.1 into that address, where nothing listens).  (Ray >= 2.59 also protects the
        # instance with a token, kept in ~/.ray/auth_token.)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if not address:
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host or int(port) > 65535:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, UnicodeError) as e:  # UnicodeError: a host name no resolver accepts
        return f"nothing answers at {host}:{port} ({getattr(e, 'strerror', None) or e})"
    return None


def _check_resources(ray, a: ClusterArgs, eval_mode: bool) -> None:
    """Refuse what a local instance can never grant: Ray would keep the actor pending, and the run
    would wait for ever (a GPU asked for on a machine without one, more CPUs than there are)."""
    total = ray.cluster_resources()
    gpus, cpus = total.get("GPU", 0.0), total.get("CPU", 0.0)
    need = max(a.learner_cpus, a.bot_cpus)  # the largest single actor must fit the cluster
    problem = None
    if a.learner_gpus > gpus and not eval_mode:  # eval starts no learner actor
        problem = (f"--learner-gpus = {a.learner_gpus:g}, but the Ray cluster has {gpus:g} GPU(s); pass "
                   "--learner-gpus 0 (and --device cpu), or join a cluster with a GPU (--address)")
    elif need > cpus:
        problem = (f"an actor asks for {need:g} CPUs, but the Ray cluster has {cpus:g}; lower --learner-cpus or "
                   "--bot-cpus")
    if problem and a.address:
        # A joined cluster may autoscale: nodes not up yet are not counted.  Say it; Ray waits for them.
        log.warning("%s (the actors wait until the cluster grows to fit them)", problem)
    elif problem:
        raise ConfigError(problem)


def _run(ray, cfg, a, stop, obs_dim, act_dim, spaces) -> int:
    learner = None
    if not cfg.eval_mode:
        spec = LearnerSpec(config=cfg.to_dict(), obs_dim=obs_dim, act_dim=act_dim, spaces=spaces,
                           metrics_path=os.path.join(a.root, "learner", "training_metrics.jsonl"),
                           weights_dir=os.path.abspath(cfg.weights_dir), latest_name=cfg.latest_name)
        os.makedirs(os.path.dirname(spec.metrics_path), exist_ok=True)
        learner = learner_actor(spec, cfg.queue_size * max(4, a.bots), a.learner_cpus, a.learner_gpus)
        try:
            ray.get(learner.pid.remote(), timeout=300)  # built, and its first actor published
            first = ray.get(learner.status.remote(), timeout=60)
        except Exception as e:  # noqa: BLE001 - Ray wraps the actor's error: say it in one line
            log.error("the learner actor could not start: %s", str(e).strip().splitlines()[-1][:500])
            return 1
        if first.get("start_error"):
            log.error("the learner could not start: %s", first["start_error"])
            return 2 if first.get("start_error_kind") == "config" else 1
    bots = [bot_actor(bot_config(cfg, i, os.path.abspath(a.root)), i, a.bot_cpus) for i in range(a.bots)]
    runs = {i: b.run.remote() for i, b in enumerate(bots)}
    hb = Heartbeat(os.path.join(a.root, "status.json"))
    watch = _Liveness(a, bots)
    address = ray.get_runtime_context().gcs_address  # where tools (and tests) can join this cluster
    started, learner_status, results = time.time(), {}, {}
    code = 0
    warned = cfg.eval_mode
    while runs and not stop.is_set():
        done, _ = ray.wait(list(runs.values()), num_returns=len(runs), timeout=POLL_S)
        for i, ref in [(i, r) for i, r in runs.items() if r in done]:
            results[i] = _result(ray, ref)
            del runs[i]
        if learner is not None:
            try:
                learner_status = ray.get(learner.status.remote(), timeout=5.0)
            except Exception as e:  # noqa: BLE001 - restarting: say so, keep going
                learner_status = {**learner_status, "learner_alive": False,
                                  "last_error": f"learner unreachable: {type(e).__name__}"}
        watch.check()
        if learner_status.get("learner_error"):  # its thread died: stop, so a person (or Ray) acts
            log.error("the learner failed: %s; stopping the cluster (its last good checkpoint is kept)",
                      learner_status["learner_error"])
            code = 1
            break
        st = {**_status(a, cfg, started, learner_status, watch), "ray_address": address}
        hb.maybe_write(lambda st=st: st)
        _progress(st, cfg)
        warned = warned or _warn_if_starved(st, cfg)
    for b in bots:  # a signal, or some bots finished: stop the rest, each closes its link
        b.request_stop.remote()
    for i, ref in runs.items():
        results[i] = _result(ray, ref, timeout=60.0)
    final = None
    if learner is not None:
        try:
            final = ray.get(learner.close.remote(), timeout=300.0)
        except Exception as e:  # noqa: BLE001
            final = {"final_save": {"ok": False, "error": f"{type(e).__name__}: {e}"}}
        fs = final.get("final_save") or {}
        log.info("final checkpoint: %s", fs.get("path") if fs.get("ok") else f"NOT written ({fs.get('error')})")
        code = max(code, 0 if fs.get("ok") else 3)
        if final.get("learner_error"):
            log.error("the learner failed: %s", final["learner_error"])
            code = 1
    failed = [i for i, r in results.items() if "error" in r]
    if failed:
        log.error("bots %s could not finish their runs: %s", failed, results[failed[0]]["error"][:300])
        code = code or 1
    st = _status(a, cfg, started, final or learner_status, watch, results)
    hb.maybe_write(lambda: st, force=True)
    if not cfg.eval_mode:
        _summary(st, results, cfg)
    print()
    print(json.dumps({"bots": {i: {k: r.get(k) for k in ("episodes", "env_steps", "dropped")}
                               for i, r in results.items()},
                      "learner_steps": st.get("learner_steps"), "replay_ratio": st.get("replay_ratio")}))
    return code


def _lost(st: dict) -> int:
    """Transitions that never reached the learner's replay: dropped by the bots' queues, by the
    learner's full inbox, or out of order after a restart."""
    return sum(int(st.get(k) or 0) for k in ("dropped_at_bots", "dropped_at_learner", "lost_out_of_order"))


def _warn_if_starved(st: dict, cfg: Config) -> bool:
    """True once it has warned: a cluster that loses over a tenth of what its bots play says so
    with the fix, not only on the progress line (which --quiet hides)."""
    ticks = int(st.get("ticks") or 0)
    if ticks < 1000 or _lost(st) <= 0.1 * ticks:
        return False
    log.warning("the learner is not keeping up: %d of %d transitions (%.0f%%) were lost on the way so far at "
                "--pace %s; use --pace learner (the default: each bot waits while the learner is behind), fewer "
                "--bots, or a lower --utd-ratio", _lost(st), ticks, 100 * _lost(st) / ticks, cfg.pace)
    return True


def _summary(st: dict, results: dict, cfg: Config) -> None:
    """The closing lines: what the bots played, what the learner got, what was lost, and the
    gradient steps per transition it achieved."""
    played = sum(int(r.get("env_steps") or 0) for r in results.values())
    dropped = sum(int(r.get("dropped") or 0) for r in results.values())
    received = int(st.get("transitions_received") or 0)
    at_learner = int(st.get("dropped_at_learner") or 0) + int(st.get("lost_out_of_order") or 0)
    utd = (st.get("learner_steps") or 0) / received if received else 0.0
    log.info("the bots played %d transitions; the learner got %d, %d were dropped at the bots and %d at the "
             "learner (%.0f%% of those played); gradient steps per transition received %.2f (utd_ratio %g)",
             played, received, dropped, at_learner, 100 * (dropped + at_learner) / max(played, 1), utd,
             cfg.utd_ratio)


def _result(ray, ref, timeout: float | None = None) -> dict:
    try:
        return ray.get(ref, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a bot that could not finish: reported, not raised
        return {"error": f"{type(e).__name__}: {e}"}


class _Liveness:
    """Per-bot round counters; a counter still for ``--freeze-timeout`` s gets its bot killed, and
    Ray's max_restarts brings it back (its run is retried)."""

    def __init__(self, a, bots):
        self.a, self.bots = a, bots
        self.last = {i: (None, time.monotonic()) for i in range(len(bots))}
        self.restarts = {i: 0 for i in range(len(bots))}

    def counter(self, i: int) -> int | None:
        return read_round_counter(os.path.join(self.a.root, f"bot{i}", "round_counter.txt"))

    def check(self) -> None:
        now = time.monotonic()
        for i, b in enumerate(self.bots):
            c = self.counter(i)
            if c != self.last[i][0]:
                self.last[i] = (c, now)
            elif self.a.freeze_timeout and now - self.last[i][1] > self.a.freeze_timeout:
                log.warning("bot%d froze (round counter %s for %.0f s): restarting it", i, c, now - self.last[i][1])
                require_ray().kill(b, no_restart=False)
                self.restarts[i] += 1
                self.last[i] = (c, now)


def _status(a, cfg, started, ls: dict, watch: _Liveness, results: dict | None = None) -> dict:
    bots = {}
    for i in range(a.bots):
        try:
            with open(os.path.join(a.root, f"bot{i}", "run", "status.json")) as fh:
                b = json.load(fh)
        except (OSError, ValueError):
            b = {}
        bots[str(i)] = {"pid": b.get("pid"), "ticks": b.get("ticks"), "episodes": b.get("episodes"),
                        "round_counter": watch.counter(i), "restarts": watch.restarts[i],
                        "policy_lag": (ls.get("bots") or {}).get(str(i), {}).get("policy_lag"),
                        "heartbeat_age_s": round(time.time() - b["time"], 1) if "time" in b else None,
                        "mode": b.get("mode")}
    st = {"pid": os.getpid(), "time": time.time(), "started": started, "mode": "cluster-eval" if cfg.eval_mode
          else "cluster", "bots": bots, "ticks": sum(b["ticks"] or 0 for b in bots.values()),
          "episodes": sum(b["episodes"] or 0 for b in bots.values())}
    st.update({k: v for k, v in ls.items() if k != "bots"})
    if results is not None:
        st["results"] = {str(i): {k: r.get(k) for k in ("episodes", "env_steps", "error")} for i, r in results.items()}
    return st


_last_line = [0.0]


def _progress(st: dict, cfg: Config) -> None:
    """One line for the whole cluster, redrawn once a second (a full line each time off a terminal)."""
    if cfg.quiet or time.monotonic() - _last_line[0] < 1.0:
        return
    _last_line[0] = time.monotonic()
    warn = "  BOTS OUTRUN THE LEARNER" if st.get("outrun") else ""
    alive = "" if st.get("learner_alive", True) else f"  learner NOT ANSWERING ({st.get('last_error')})"
    line = (f"cluster: {len(st['bots'])} bots  ticks {st['ticks']}  episodes {st['episodes']}  "
            f"learner steps {st.get('learner_steps', 0)}  v{st.get('policy_version', 0)}  "
            f"replay ratio {st.get('replay_ratio', 0)}/{st.get('replay_ratio_target', 0)}  "
            f"capacity {st.get('capacity_samples_per_s', 0)} samples/s{warn}{alive}")
    import sys

    print(line, file=sys.stderr, flush=True)
