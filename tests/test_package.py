"""The package outside its repo: the wheel's contents, the shipped pretrained bot found through
importlib.resources, and (slow) a fresh venv that installs the wheel and evaluates the bot from an
empty directory."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from sacbot.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a build must not see: the dev venv, run outputs, local checkpoints and old build trees
# (setuptools reuses build/lib, so a module deleted from the tree could still reach the wheel).
_NOT_SOURCE = shutil.ignore_patterns(".venv", ".git", "build", "dist", "runs", "weights", "*.egg-info",
                                     "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")


def build_wheel(tmp_path) -> str:
    """``pip wheel .`` on a copy of the source tree, so the working tree gets no build/ or
    egg-info; returns the wheel's path."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    # A setuptools that builds wheels by itself (70.1+) saves fetching one into an isolated
    # build env; python 3.11's venv ships 65.5, which needs the "wheel" package besides.
    try:
        import setuptools

        own = int(setuptools.__version__.split(".")[0]) >= 71
    except (ImportError, ValueError):
        own = False
    isolation = ["--no-build-isolation"] if own else []
    out = tmp_path / "dist"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (wheel,) = out.glob("sacbot-*.whl")
    return str(wheel)


@pytest.mark.timeout(300)
def test_the_wheel_holds_sacbot_its_envs_and_the_pretrained_bot_and_no_top_level_envs(tmp_path):
    wheel = zipfile.ZipFile(build_wheel(tmp_path))
    names = set(wheel.namelist())
    for want in ("sacbot/app/cli.py", "sacbot/store/pretrained.py", "sacbot/bots/tankduel.zip", "sacbot/bots/README.md",
                 "sacbot/envs/__init__.py", "sacbot/envs/tank_duel.py", "sacbot/envs/memory.py",
                 "sacbot/serve/server.py", "sacbot/serve/protocol.py", "sacbot/serve/client.py"):
        assert want in names, want
    # A top-level "envs" would overwrite any other project's envs package in a user's environment.
    assert not [n for n in names if n.startswith("envs/")]
    top = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top).decode().split() == ["sacbot"]


def test_eval_from_any_directory_plays_the_bot_shipped_in_the_package(tmp_path, monkeypatch, caplog):
    from sacbot import Agent
    from sacbot.acting.games import make_env

    monkeypatch.chdir(tmp_path)  # no ./weights, no ./weights/pretrained
    cfg = dataclasses.replace(Config(), eval_mode=True, run_dir=str(tmp_path / "run"))
    env = make_env(cfg.env)
    caplog.set_level(logging.INFO, logger="sacbot")
    agent = Agent(cfg, env.observation_space, env.action_space)
    try:
        assert agent.loaded_from is not None
        assert os.path.samefile(agent.loaded_from, os.path.join(ROOT, "sacbot", "bots", "tankduel.zip"))
        assert any("pretrained bot" in m and "README.md" in m for m in caplog.messages)
        assert agent.policy_version == 88002  # the shipped bot's step (sacbot/bots/README.md)
    finally:
        agent.close()
        env.close()


def test_a_bot_in_weights_pretrained_comes_before_the_shipped_one_and_a_bad_one_is_skipped(tmp_path, caplog):
    from sacbot.store import pretrained
    local = tmp_path / "weights" / "pretrained"
    local.mkdir(parents=True)
    (local / "a_broken.zip").write_bytes(b"not a zip")
    shutil.copy(os.path.join(ROOT, "sacbot", "bots", "tankduel.zip"), local / "b_mine.zip")
    log = logging.getLogger("sacbot")
    caplog.set_level(logging.INFO, logger="sacbot")
    found = pretrained.find("sacbot/TankDuel-v0", {}, log, str(tmp_path / "weights"))
    assert found is not None and found[1] == str(local / "b_mine.zip")
    assert any("a_broken.zip is not usable" in m for m in caplog.messages)
    assert pretrained.find("Pendulum-v1", {}, log, str(tmp_path / "weights")) is None  # not its env


def _clean_env() -> dict:
    # The fresh venv must see only what it installed: no PYTHONPATH into the repo, no active venv.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_in_a_fresh_venv_evaluates_the_pretrained_bot_from_an_empty_directory(tmp_path):
    """The wheel in a fresh venv (no system site-packages, so a missing dependency fails), without
    torch: `sacbot eval --episodes 2` from an empty directory plays the shipped bot, and `sacbot run`
    says which extra training needs."""
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    env = _clean_env()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
        # --no-compile: byte-compiling torch's files takes most of the install time otherwise.
        p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", wheel],
                           capture_output=True, text=True, timeout=420, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        empty = tmp_path / "empty"
        empty.mkdir()
        p = subprocess.run([str(venv / "bin" / "sacbot"), "eval", "--episodes", "2"], cwd=empty,
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        site = str(venv / "lib")
        assert "evaluating the pretrained bot " + site in p.stderr  # from the installed package
        assert "eval: 2 episodes" in p.stdout and "won" in p.stdout
        assert os.listdir(empty) == ["runs"]  # eval saved nothing: only its run logs
        p = subprocess.run([str(venv / "bin" / "python"), "-c", "import envs"], cwd=empty,
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode != 0 and "No module named 'envs'" in p.stderr
        p = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], cwd=empty,
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode != 0, "the base install brought torch"
        p = subprocess.run([str(venv / "bin" / "sacbot"), "run", "--steps", "10"], cwd=empty,
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2 and "sacbot[train]" in p.stderr, p.stderr
        assert os.listdir(empty) == ["runs"] or sorted(os.listdir(empty)) == ["runs"], os.listdir(empty)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~0.9 GB: pytest keeps the last three tmp dirs


# The public API: what the README, docs/ and the modules' usage examples tell a user to call.
PUBLIC = {
    "sacbot": None,  # its __all__
    "sacbot.acting.policy": ["ActorParams", "PolicyState", "Linear", "LSTMCell", "build_params", "initial_state",
                             "act", "mean_and_log_std"],
    "sacbot.wire.status": ["LearnerStatus"],
    "sacbot.wire.boundary": ["Learner", "LearnerLink", "LearnerSpec", "Start"],
    "sacbot.serve.client": ["SacbotClient", "ServerError"],
    "sacbot.store.checkpoint": ["read_checkpoint", "write_checkpoint", "load_latest", "load_actor", "CheckpointError"],
    "sacbot.envs.pomdp": ["Flicker", "KeepObservationIndices"],
}


def test_every_public_class_function_and_method_has_a_docstring():
    import importlib
    import inspect

    missing = []
    for modname, names in PUBLIC.items():
        mod = importlib.import_module(modname)
        for name in names if names is not None else [n for n in mod.__all__ if not n.startswith("__")]:
            obj = getattr(mod, name)
            # A class's own docstring: not a base's, nor the signature dataclasses write in its place.
            doc = vars(obj).get("__doc__") if inspect.isclass(obj) else inspect.getdoc(obj)
            if not doc or doc.startswith(f"{name}("):
                missing.append(f"{modname}.{name}")
            if inspect.isclass(obj):
                fields = getattr(obj, "__dataclass_fields__", {})
                for attr, member in vars(obj).items():
                    fn = member.fget if isinstance(member, property) else member
                    if attr.startswith("_") or attr in fields or not (
                            inspect.isfunction(fn) or isinstance(member, classmethod)):
                        continue
                    if not inspect.getdoc(member.__func__ if isinstance(member, classmethod) else fn):
                        missing.append(f"{modname}.{name}.{attr}")
    assert not missing, f"public names without a docstring: {missing}"
