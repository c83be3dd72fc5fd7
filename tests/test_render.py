"""``sacbot render``: a GIF of one episode, in the env the checkpoint trained in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sacbot.app.cli import main

PIL = pytest.importorskip("PIL", reason="Pillow (plot extra) is not installed")
from PIL import Image  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "sacbot", "bots", "tankduel.zip")


@pytest.mark.parametrize("args, says", [
    (["--random"], "--random needs --env"),
    (["--random", "--env", "Pendulum-v1", "--every", "0"], "--every = 0 is not accepted: expected an integer >= 1"),
    (["--random", "--env", "Pendulum-v1", "--seed", "-1"], "--seed = -1 is not accepted"),
    (["--random", "--env", "Pendulum-v1", "--max-ticks", "0"], "--max-ticks = 0 is not accepted"),
    (["--random", "--env", "Pendulum-v1", "--out", "{tmp}"], "expected a file name ending in .gif"),
    (["--random", "--env", "Pendulum-v1", "--out", "{tmp}/x.txt"], "expected a file name ending in .gif"),
    (["--random", "--env", "Pendulum-v1", "--out", "{tmp}/nodir/x.gif"], "expected a .gif file in an existing"),
    (["--random", "--env", "Pendulum-v1", "--env-kwargs", "{{nope"], "--env-kwargs is not JSON"),
    (["--random", "--env", "Pendulum-v1", "--env-kwargs", "[1]"], "expected a JSON object"),
])
def test_bad_flags_are_refused_before_anything_is_played_or_written(args, says, tmp_path, capsys):
    assert main(["render", *(s.format(tmp=tmp_path) for s in args)]) == 2
    assert says in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(120)
def test_the_shipped_bot_plays_its_own_duel_and_wins_it(tmp_path):
    # A subprocess, as a user runs it: the env (and opponent) come from the checkpoint's manifest.
    out = tmp_path / "duel.gif"
    r = subprocess.run([sys.executable, "-m", "sacbot", "render", SHIPPED, "--out", str(out)], capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(", won"), r.stdout  # this seed is a win for the shipped bot
    frames = int(r.stdout.split(": ")[1].split(" frames")[0])
    assert Image.open(out).n_frames == frames > 10


def test_any_env_that_draws_frames_renders_and_a_random_policy_needs_no_checkpoint(tmp_path, capsys):
    out = tmp_path / "p.gif"
    assert main(["render", "--random", "--env", "Pendulum-v1", "--max-ticks", "9", "--every", "3",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: 3 frames, 9 ticks, return ")
    assert Image.open(out).n_frames == 3


def test_a_checkpoint_in_an_env_of_other_spaces_and_a_missing_file_are_errors_naming_them(tmp_path, capsys):
    assert main(["render", SHIPPED, "--env", "Pendulum-v1", "--out", str(tmp_path / "x.gif")]) == 1
    err = capsys.readouterr().err
    assert "the actor reads" in err and "render it in the env it trained in" in err, err
    assert main(["render", str(tmp_path / "none.zip"), "--out", str(tmp_path / "x.gif")]) == 1
    assert f"cannot load {tmp_path / 'none.zip'}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
