"""docs/your-game.md, run as a new user would: its game file written out, then its commands, in
a fresh directory (the install line aside: this suite runs in the installed package)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "your-game.md")
# The console script a user runs: unlike `python -m`, it does not put the working directory on the
# path, which is what --env module:Name must make up for.
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "sacbot")
SACBOT = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "sacbot"]


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```([^\n]*)\n(.*?)```", text, flags=re.S)


@pytest.mark.timeout(300)
def test_the_guide_trains_and_evaluates_its_game_from_a_fresh_directory(tmp_path):
    blocks = _blocks(open(DOC).read())
    (name,) = [info.split("file=")[1] for info, _ in blocks if "file=" in info]
    (code,) = [body for info, body in blocks if "file=" in info]
    (tmp_path / name).write_text(code)
    (commands,) = [body for info, body in blocks if info.strip() == "sh"]
    lines = [line for line in commands.splitlines() if line.strip()]
    assert len(lines) <= 5 and lines[0].startswith("pip install")
    outs = []
    for line in lines[1:]:
        argv = shlex.split(line)
        assert argv[0] == "sacbot", line
        p = subprocess.run([*SACBOT, *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=200, env={**os.environ, "PYTHONPATH": ""})
        assert p.returncode == 0 and "Traceback" not in p.stderr, (line, p.stderr[-2000:])
        outs.append(p)
    episodes = [json.loads(x) for x in (tmp_path / "runs" / "reach" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 40 and episodes[-1]["env_steps"] == 2000
    assert (tmp_path / "weights" / "reach" / "sac_latest.zip").exists()
    assert re.search(r"eval: 10 episodes, return -?\d", outs[1].stdout), outs[1].stdout
    assert (tmp_path / "runs" / "reach" / "plots" / "overview.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("env_id, says", [
    ("nomod:Reach", "module 'nomod' does not import"),
    ("mygame:Nope", "'Nope' is neither a gymnasium.Env subclass in it nor an id it registers"),
])
def test_a_game_module_that_cannot_be_used_is_a_config_error_that_names_it(tmp_path, env_id, says):
    code = dict((i, b) for i, b in _blocks(open(DOC).read()))["python file=mygame.py"]
    (tmp_path / "mygame.py").write_text(code)
    p = subprocess.run([*SACBOT, "run", "--env", env_id, "--steps", "10", "--quiet"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert not (tmp_path / "weights").exists()


def test_a_class_named_by_module_is_played_with_its_kwargs(tmp_path):
    from sacbot.acting.games import make_env

    (tmp_path / "kwgame.py").write_text(
        "import gymnasium as gym, numpy as np\n"
        "class Line(gym.Env):\n"
        "    max_episode_steps = 7\n"
        "    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)\n"
        "    def __init__(self, size=2):\n"
        "        self.observation_space = gym.spaces.Box(-1, 1, (size,), np.float32)\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(self.observation_space.shape, np.float32), {}\n"
        "    def step(self, a):\n"
        "        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        env = make_env("kwgame:Line", kwargs={"size": 5})
    finally:
        os.chdir(cwd)
    assert env.observation_space.shape == (5,)
    env.reset(seed=0)
    steps = 0
    while not env.step(env.action_space.sample())[3]:
        steps += 1
    assert steps + 1 == 7  # the class's max_episode_steps
