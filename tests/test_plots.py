"""sacbot plot: one overview image of a run, or several overlaid (checked on the figure it draws)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="matplotlib (test/plot extra) is not installed")

from sacbot.app import plot as pl  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "run_small")
SACBOT = [sys.executable, "-m", "sacbot"]


def _axes(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def _with_outcomes(tmp_path, name: str, won: list[bool], opponent: str = "tracker"):
    """The fixture run with its episodes given an opponent, an outcome and an env step each."""
    d = tmp_path / name
    shutil.copytree(FIXTURE, d)
    eps = [json.loads(x) for x in (d / "episodes.jsonl").read_text().splitlines()]
    with open(d / "episodes.jsonl", "w") as fh:
        for i, (e, w) in enumerate(zip(eps, won)):
            fh.write(json.dumps({**e, "opponent": opponent, "won": w, "env_steps": 100 * (i + 1)}) + "\n")
    return d


def test_every_panel_is_drawn_on_its_own_axis_from_the_fixture():
    fig = pl.overview([FIXTURE])
    axes = _axes(fig)
    assert set(axes) == set(pl.PANELS)
    ret = axes["return"].lines
    assert len(ret) == 1 and list(ret[0].get_xdata()) == [200 * (i + 1) for i in range(7)]  # env steps: sum of lengths
    for panel in ("critic loss", "actor loss", "alpha loss", "alpha"):
        lines = axes[panel].lines
        assert len(lines) == 1 and len(lines[0].get_xdata()) > 10, panel  # one quantity per axis
    assert axes["alpha"].get_yscale() == "log"
    assert not axes["win rate"].lines  # the fixture's episodes report no outcome
    assert len(axes["eval return"].containers[0].lines[0].get_xdata()) == 2


def test_win_rates_per_opponent_follow_the_outcomes_at_their_env_steps(tmp_path):
    d = _with_outcomes(tmp_path, "a", [False, False, True, True, True, True, True])
    (line,) = _axes(pl.overview([str(d)]))["win rate"].lines
    assert list(line.get_xdata()) == [100, 200, 300, 400, 500, 600, 700]
    assert line.get_ydata()[-1] == pytest.approx(5 / 7) and line.get_ydata()[1] == 0.0
    assert line.get_label() == "tracker"


def test_several_runs_are_overlaid_in_one_colour_each_with_a_legend(tmp_path):
    a = _with_outcomes(tmp_path, "a", [True] * 7)
    b = _with_outcomes(tmp_path, "b", [False] * 7)
    axes = _axes(pl.overview([str(a), str(b)]))
    wins = axes["win rate"].lines
    assert [x.get_label() for x in wins] == ["a: tracker", "b: tracker"]
    assert wins[0].get_color() != wins[1].get_color()
    assert [x.get_ydata()[-1] for x in wins] == [1.0, 0.0]
    assert {x.get_label() for x in axes["critic loss"].lines} == {"a: critic_loss", "b: critic_loss"}
    assert axes["win rate"].get_legend() is not None


def test_lines_the_panels_cannot_draw_are_skipped_by_name(tmp_path, caplog):
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "episodes.jsonl", "ab") as fh:  # after the fixture's 7 lines
        fh.write(b'\xff\xfe not utf-8\n{"episode": 9, "return": "x"}\n[1]\n{"episode": 10}\n')
    with open(tmp_path / "training_metrics.jsonl", "a") as fh:
        fh.write('{"grad_steps": 5, "drops": 3}\n')
    with caplog.at_level(logging.WARNING, logger="sacbot"):
        fig = pl.overview([str(tmp_path)])
    assert len(_axes(fig)["return"].lines[0].get_xdata()) == 7  # the good episodes, all of them
    said = "\n".join(r.getMessage() for r in caplog.records)
    for says in ("malformed line 8 of", "line 9 of", "'return' is not a number", "line 10 of",
                 "not a JSON object", "line 11 of", "no 'return'", "'drops' is not an object"):
        assert says in said, said


def test_a_negative_std_and_a_directory_in_a_files_place_are_skipped_not_raised(tmp_path, caplog):
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "evals.jsonl", "a") as fh:
        fh.write('{"mean_return": 1.0, "std_return": -2}\n')
    os.unlink(tmp_path / "training_metrics.jsonl")
    os.mkdir(tmp_path / "training_metrics.jsonl")
    with caplog.at_level(logging.WARNING, logger="sacbot"):
        fig = pl.overview([str(tmp_path)])
    assert _axes(fig)["return"].lines
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "'std_return' is negative" in said and "training_metrics.jsonl: not a file" in said


def test_the_command_writes_a_png_and_refuses_what_it_cannot_draw(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    r = subprocess.run(SACBOT + ["plot", str(run)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = run / "plots" / "overview.png"
    assert r.stdout.strip() == str(out) and out.read_bytes()[:4] == b"\x89PNG"
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [([str(empty)], 1, "no episodes.jsonl"),
             ([str(run), str(run)], 2, "several runs need --out"),
             ([str(tmp_path / "missing")], 2, "is not a directory"),
             ([str(run), "--out", str(tmp_path)], 2, "is a directory; expected the path of the PNG")]
    for args, code, says in cases:
        r = subprocess.run(SACBOT + ["plot", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == code and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
