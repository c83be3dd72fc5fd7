#!/usr/bin/env python3
"""TankDuel learning curves: win rate against env steps, from a run's step checkpoints.

Train first, keeping every step checkpoint, e.g. against spinner::

    sacbot run --env sacbot/TankDuel-v0 --env-kwargs '{"opponents": ["spinner"]}' \\
        --pace lockstep --steps 40000 --keep-last 100 --weights-path /tmp/td/spinner/w

then evaluate each ``sac_step_<N>.zip`` of one or more runs, deterministically (eval mode: the
tanh of the mean, in numpy), on the same episode seeds, with a uniform-random policy as contrast::

    python tools/bench/tankduel.py --runs lstm=/tmp/td/spinner/w --episodes 20 --random spinner

The env, its kwargs and ``memoryless`` come from each checkpoint's manifest, so a run is
evaluated in the duel it trained on; ``--eval-env-kwargs`` lays kwargs over those (and over the
random policy's), e.g. to play a run trained with a wide radar at the registered arc.  One JSON
line per point; the last line is the summary.

``--train`` runs the training first, lockstep, ``--jobs`` runs at a time (each takes a core), for
sacbot and its memoryless control against each opponent, once per ``--seed`` (the radar duels, which leave
memory to the player)::

    python tools/bench/tankduel.py --train --env sacbot/TankDuelRadar-v1 --opponents sitting_duck tracker \
        --seed 0 1 2 --jobs 2 --steps 60000 --save-every 5000 --episodes 20 --random sitting_duck tracker

The summary's ``final`` holds, per opponent, each seed's win rate at its last checkpoint for sacbot
and the control (runs named ``sacbot-OPPONENT-sSEED`` and ``memoryless-OPPONENT-sSEED``, as
``--train`` names them), their means and sacbot's ``gap`` over the control.

``--fp32`` also evaluates each run's last checkpoint with its fp32 actor (the QAT actor's float
weights, inputs clipped to the learned ranges, no rounding) and with the bare float weights,
beside the int8 actor acting runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import sacbot.envs  # noqa: E402,F401 - registers TankDuel
from sacbot.acting import policy  # noqa: E402
from sacbot.acting.games import env_layout, saved_layout  # noqa: E402
from sacbot.envs.tank_duel import OPPONENTS  # noqa: E402
from sacbot.store import checkpoint as ck  # noqa: E402

SEED0 = 10_000  # eval episodes use seeds SEED0 + k, apart from training's 0, 1, 2, ...
# play() reads the duel's info (opponent, won): no other env can be evaluated here.
TANKDUEL_ENVS = ("sacbot/TankDuel-v0", "sacbot/TankDuelRadar-v0", "sacbot/TankDuelRadar-v1", "sacbot/TankDuelMemory-v0")


def play(env: gym.Env, act, episodes: int) -> dict:
    wins, rets, opps = [], [], []
    for k in range(episodes):
        # episode_index: a scheduled duel (cycle) meets each opponent in turn, not the first alone
        obs, info = env.reset(seed=SEED0 + k, options={"episode_index": k})
        opps.append(info["opponent"])
        state, done, ret = None, False, 0.0
        while not done:
            a, state = act(obs, state)
            obs, r, term, trunc, info = env.step(a)
            ret += float(r)
            done = term or trunc
        wins.append(bool(info["won"]))
        rets.append(ret)
    by_opp = {o: float(np.mean([w for w, p in zip(wins, opps) if p == o])) for o in dict.fromkeys(opps)}
    return {"win_rate": float(np.mean(wins)), "mean_return": round(float(np.mean(rets)), 3), "episodes": episodes,
            "win_rate_by_opponent": by_opp}


def actor_fn(path: str, kind: str = "int8"):
    """kind: int8 (as deployed), fp32 (float weights and inputs each clipped to the learned ranges,
    unrounded) or fp32-noclip (the bare latent float weights); see tools/bench/learning.py,
    fp32_arrays."""
    from tools.bench.learning import checkpoint_config, fp32_actor

    arrays = ck.load_actor(path) if kind == "int8" else fp32_actor(path, clip=kind == "fp32")
    params = policy.build_params(arrays)
    cfg = checkpoint_config(path)

    def act(obs, state):
        if state is None or cfg.get("memoryless"):
            state = policy.initial_state(params)
        return policy.act(params, np.asarray(obs, np.float32), state, None)

    return act, cfg


def eval_env(cfg: dict, overrides: dict) -> gym.Env:
    """The env a checkpoint trained in (its id and kwargs, with the previous reward appended to
    the observation where it trained so), with ``overrides`` laid over its kwargs."""
    env = gym.make(cfg["env"], **{**json.loads(cfg.get("env_kwargs") or "{}"), **overrides})
    if cfg.get("reward_input"):
        from tools.bench.learning import with_reward_input

        env = with_reward_input(env)
    return env


def layout_change(cfg: dict, env: gym.Env) -> str | None:
    """What of ``env`` (a checkpoint's env with the eval's kwargs laid over) changes what the actor
    trained with (its ``cfg``), as sacbot eval would refuse it (the env's layout kwargs), as a
    message; None if nothing does."""
    trained, now = saved_layout(cfg), env_layout(env)
    keys = ck.layout_differences(trained, now)
    if not keys:
        return None
    k = keys[0]
    return f"{k}={now[k]!r} changes what the actor trained with ({k}={trained[k]!r} in {cfg['env']})"


def random_fn(seed: int):
    rng = np.random.default_rng(seed)
    return lambda obs, state: (rng.uniform(-1, 1, 4).astype(np.float32), None)


def train_cmd(a, variant: str, opp: str, seed: int, d: str) -> list[str]:
    return [sys.executable, "-m", "sacbot", "run", "--env", a.env, "--env-kwargs",
            json.dumps({**a.train_env_kwargs, "opponents": [opp]}), "--pace", "lockstep", "--steps", str(a.steps),
            "--seed", str(seed), "--save-interval", str(a.save_every), "--keep-last", "1000",
            "--no-save-replay", "--quiet", "--run-dir", os.path.join(d, "run"),
            "--weights-path", os.path.join(d, "w"), *(["--memoryless"] if variant == "memoryless" else [])]


def train(a) -> list[str]:
    """One lockstep run per (opponent, seed, variant), ``--jobs`` at a time (each takes a core);
    returns NAME=WEIGHTS_DIR specs, named VARIANT-OPPONENT-sSEED."""
    runs = [(variant, opp, seed) for opp in dict.fromkeys(a.opponents) for seed in dict.fromkeys(a.seed)
            for variant in ("sacbot", "memoryless")]  # a seed or opponent given twice is one run
    dirs: dict = {}
    failed = threading.Event()  # after a failure no run starts; those running finish
    done: list = []

    def one(run):
        if failed.is_set():
            return None
        dirs[run] = d = tempfile.mkdtemp(prefix="tankduel-{}-{}-s{}-".format(*run))
        cmd = train_cmd(a, *run, d)
        print("training: " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:  # progress: a run takes minutes to hours
            done.append(run)
            print("bench_tankduel: trained {} against {} (seed {}) in {:.1f} min; {} of {} runs done"
                  .format(*run, (time.monotonic() - t0) / 60, len(done), len(runs)), file=sys.stderr, flush=True)
        else:
            failed.set()
            # The child's own message says what was wrong (captured: its progress is noise here).
            # Its directory is kept: a run that died late holds checkpoints worth evaluating.
            tail = "\n".join(r.stderr.strip().splitlines()[-5:])
            print("bench_tankduel: training {} against {} (seed {}) failed (exit {}); its files are in {}:\n{}"
                  .format(*run, r.returncode, d, tail), file=sys.stderr)
        return r.returncode

    with concurrent.futures.ThreadPoolExecutor(a.jobs, thread_name_prefix="bench-train") as pool:
        try:
            codes = [c for c in pool.map(one, runs) if c]
        except KeyboardInterrupt:  # no run starts after it; those running got the SIGINT too
            failed.set()
            raise
    if codes:
        sys.exit(codes[0] if codes[0] > 0 else 1)
    return ["{}-{}-s{}={}".format(*run, os.path.join(dirs[run], "w")) for run in runs]


def finals(curves: dict) -> dict:
    """Each --train opponent's last-checkpoint win rates per seed, their means, and sacbot's gap
    over the memoryless control (the goal in BENCHMARKS.md: >= 0.8 and >= 0.3 above the control)."""
    out: dict = {}
    for name, curve in curves.items():
        variant, _, rest = name.partition("-")
        opp, _, seed = rest.rpartition("-s")
        if variant in ("sacbot", "memoryless") and curve and seed.isdigit():
            last = [r for r in curve if r["actor"] == "int8"][-1]
            out.setdefault(opp, {}).setdefault(variant, {})[seed] = last["win_rate"]
    for per in out.values():
        means = {v: float(np.mean(list(w.values()))) for v, w in per.items()}
        per.update({f"{v}_mean": m for v, m in means.items()})
        if len(means) == 2:
            per["gap"] = means["sacbot"] - means["memoryless"]
    return out


def evaluate_run(name: str, wdir: str, a) -> list[dict]:
    curve = []
    steps = ck.step_files(wdir)
    for k, (_, path) in enumerate(steps):
        for kind in ("int8", "fp32", "fp32-noclip") if a.fp32 and k == len(steps) - 1 else ("int8",):
            act, cfg = actor_fn(path, kind)
            env = eval_env(cfg, a.eval_env_kwargs)
            r = play(env, act, a.episodes)
            man = ck.read_checkpoint(path, entries=("actor",))["manifest"]
            r.update(run=name, env_steps=int(man["env_steps"]), grad_steps=int(man["step"]),
                     env_kwargs=cfg.get("env_kwargs"), eval_env_kwargs=a.eval_env_kwargs or None,
                     memoryless=bool(cfg.get("memoryless")), actor=kind)
            print(json.dumps(r), flush=True)
            curve.append(r)
    return curve


def repeated_names(specs: list[str]) -> list[str]:
    """The NAMEs given more than once among NAME=PATH specs: the summaries are keyed by name, so
    one run's results would hide another's."""
    names = [spec.partition("=")[0] for spec in specs]
    return sorted(n for n in set(names) if names.count(n) > 1)


def json_object(text: str) -> dict:
    """argparse type: a JSON object, or a clear error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"wants a JSON object like '{{\"radar_arc\": 40}}', got {text!r}")
    if "render_mode" in value:  # the benches play without drawing; "human" failed deep in gymnasium
        raise argparse.ArgumentTypeError(f"render_mode is not for a bench (sacbot render draws one): {text!r}")
    return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="*", default=[], metavar="NAME=WEIGHTS_DIR",
                   help="runs to evaluate: every sac_step_<N>.zip in each weights dir")
    p.add_argument("--random", nargs="*", default=[], metavar="OPPONENT",
                   help="also evaluate a uniform-random policy against these opponents")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--fp32", action="store_true", help="also evaluate each run's last checkpoint's fp32 actor")
    p.add_argument("--eval-env-kwargs", type=json_object, default={}, metavar="JSON",
                   help="env kwargs laid over each checkpoint's own when evaluating it, e.g. "
                   "'{\"radar_arc\": 40}' for a run trained with a wider radar")
    p.add_argument("--train", action="store_true", help="train sacbot and the memoryless control first")
    p.add_argument("--env", default=None, help="the duel --train trains in (default sacbot/TankDuelRadar-v1) "
                   "and --random plays (default sacbot/TankDuel-v0)")
    p.add_argument("--opponents", nargs="+", default=["sitting_duck", "tracker"], help="with --train")
    p.add_argument("--train-env-kwargs", type=json_object, default={}, metavar="JSON",
                   help="with --train: env kwargs for every run (each run's opponent is set by --opponents)")
    p.add_argument("--steps", type=int, default=40000, help="with --train: env steps per run")
    p.add_argument("--save-every", type=int, default=2500, help="with --train: gradient steps between points")
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="with --train: one run per seed and variant")
    p.add_argument("--jobs", type=int, default=1, help="with --train: runs at once (each takes a core)")
    a = p.parse_args()
    for flag, value in (("--episodes", a.episodes), ("--steps", a.steps), ("--save-every", a.save_every),
                        ("--jobs", a.jobs)):
        if value < 1:
            p.error(f"{flag} wants an integer >= 1, got {value}")
    if a.env is not None and a.env not in TANKDUEL_ENVS:
        p.error(f"--env wants one of {', '.join(TANKDUEL_ENVS)}, got {a.env!r}")
    for flag, opps in (("--opponents", a.opponents if a.train else []), ("--random", a.random)):
        unknown = [o for o in opps if o not in OPPONENTS]
        if unknown:
            p.error(f"{flag}: unknown opponent(s) {', '.join(unknown)}; known: {', '.join(sorted(OPPONENTS))}")
    out: dict = {"bench": "tankduel", "episodes": a.episodes, "curves": {}, "random": {}}
    random_env = a.env or "sacbot/TankDuel-v0"
    a.env = a.env or "sacbot/TankDuelRadar-v1"
    if "opponents" in a.train_env_kwargs:
        p.error("--train-env-kwargs: give the opponents with --opponents")
    if a.train:  # a misspelt kwarg fails here, not after the first run's training
        try:
            gym.make(a.env, **a.train_env_kwargs).close()
        except (TypeError, ValueError) as e:
            p.error(f"--train-env-kwargs {json.dumps(a.train_env_kwargs)} does not make {a.env}: {e}")
    # A bad --eval-env-kwargs fails here, against each run's own env, before any training.
    from tools.bench.learning import checkpoint_config

    checks = [({"env": a.env}, "--train")] if a.train else []
    checks += [({"env": random_env}, "--random")] if a.random else []
    if repeated_names(a.runs):
        p.error(f"--runs: each NAME once, got {repeated_names(a.runs)} more than once")
    if not (a.runs or a.random or a.train):
        p.error("nothing to measure: give --runs NAME=WEIGHTS_DIR, --random OPPONENT or --train")
    for spec in a.runs:
        name, sep, wdir = spec.partition("=")
        if not sep or not name.strip() or not os.path.isdir(wdir):
            p.error(f"--runs wants NAME=WEIGHTS_DIR with a name and an existing directory, got {spec!r}")
        if not ck.step_files(wdir):
            p.error(f"{wdir}: no sac_step_<N>.zip files (train with --keep-last large enough)")
        # Every point's manifest, before any is played: a wrong or unreadable file stops nothing half-way.
        for _, path in ck.step_files(wdir):
            try:
                cfg = checkpoint_config(path)
            except ck.CheckpointError as e:
                print(f"bench_tankduel: {e}", file=sys.stderr)
                return 1
            if cfg.get("env") not in TANKDUEL_ENVS:
                p.error(f"--runs {name}: {path} trained on {cfg.get('env')}; only the TankDuel envs "
                        f"({', '.join(TANKDUEL_ENVS)}) can be evaluated")
        checks.append((cfg, name))
    # Every run's env, also without --eval-env-kwargs: an old run's saved kwargs may no longer make it.
    for cfg, what in checks:
        try:
            env = eval_env(cfg, a.eval_env_kwargs)
        except (TypeError, ValueError, gym.error.Error) as e:
            if a.eval_env_kwargs:
                p.error(f"--eval-env-kwargs {json.dumps(a.eval_env_kwargs)} does not make {what}'s env: {e}")
            p.error(f"{what}'s env no longer makes from its saved id and kwargs: {e}")
        why = layout_change(cfg, env) if what != "--random" and a.eval_env_kwargs else None  # random reads nothing
        env.close()
        if why:
            p.error(f"--eval-env-kwargs: {why}, for {what}")
    try:
        trained = train(a) if a.train else []
    except KeyboardInterrupt:  # the runs got the same SIGINT: each saved its checkpoint and stopped
        print("bench_tankduel: interrupted while training; nothing evaluated", file=sys.stderr)
        return 130
    for spec in list(a.runs) + trained:
        name, _, wdir = spec.partition("=")
        try:
            out["curves"][name] = evaluate_run(name, wdir, a)
        except ck.CheckpointError as e:  # a file changed since it was checked, or a --train run's
            print(f"bench_tankduel: {e}", file=sys.stderr)
            return 1
    for opp in a.random:
        env = gym.make(random_env, **{**a.eval_env_kwargs, "opponents": [opp]})
        r = play(env, random_fn(0), a.episodes)
        r.update(run="random", opponent=opp)
        print(json.dumps(r), flush=True)
        out["random"][opp] = r
    out["final"] = finals(out["curves"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
