"""plot_metrics renders every panel from a fixture run directory (checked on the figures)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import load_tool

pytest.importorskip("matplotlib", reason="matplotlib (test/plot extra) is not installed")

TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "plot_metrics.py")
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "run_small")
pm = load_tool("plot_metrics")


def test_every_panel_is_drawn_from_the_fixture():
    figs = pm.figures(FIXTURE)
    assert set(figs) == set(pm.PANELS)
    for name, fig in figs.items():
        ax = fig.axes[0]
        artists = ax.lines + ax.containers
        assert artists, f"panel {name} drew nothing"
        assert ax.get_legend() is not None, f"panel {name} has no legend"
    returns = figs["returns"].axes[0].lines
    assert len(returns) == 2 and len(returns[0].get_xdata()) == 7  # raw + moving average, 7 episodes
    losses = {line.get_label() for line in figs["losses"].axes[0].lines}
    assert losses == {"critic_loss", "actor_loss", "alpha_loss", "alpha"}
    assert len(figs["evals"].axes[0].containers[0].lines[0].get_xdata()) == 2


def test_cli_writes_pngs_and_fails_clearly_on_an_empty_dir(tmp_path):
    out = tmp_path / "plots"
    r = subprocess.run([sys.executable, TOOL, FIXTURE, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == sorted(f"{p}.png" for p in pm.PANELS)
    assert all((out / f"{p}.png").read_bytes()[:4] == b"\x89PNG" for p in pm.PANELS)
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([sys.executable, TOOL, str(empty)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no episodes.jsonl" in r.stderr


def test_lines_the_panels_cannot_draw_are_skipped_by_name(tmp_path, capsys):
    import shutil

    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "episodes.jsonl", "ab") as fh:  # after the fixture's 7 lines
        fh.write(b'\xff\xfe not utf-8\n{"episode": 9, "return": "x"}\n[1]\n{"episode": 10}\n')
    with open(tmp_path / "training_metrics.jsonl", "a") as fh:
        fh.write('{"grad_steps": 5, "drops": 3}\n')
    figs = pm.figures(str(tmp_path))
    assert len(figs["returns"].axes[0].lines[0].get_xdata()) == 7  # the good episodes, all of them
    err = capsys.readouterr().err
    for says in ("malformed line 8 of", "line 9 of", "'return' is not a number", "line 10 of",
                 "not a JSON object", "line 11 of", "no 'return'", "'drops' is not an object"):
        assert says in err, err


def test_a_negative_std_and_a_directory_in_a_files_place_are_skipped_not_raised(tmp_path, capsys):
    import shutil

    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "evals.jsonl", "a") as fh:
        fh.write('{"mean_return": 1.0, "std_return": -2}\n')
    os.unlink(tmp_path / "training_metrics.jsonl")
    os.mkdir(tmp_path / "training_metrics.jsonl")
    figs = pm.figures(str(tmp_path))  # matplotlib refused the negative error bar; open() the directory
    assert "returns" in figs
    err = capsys.readouterr().err
    assert "'std_return' is negative" in err and "training_metrics.jsonl: not a file" in err


def test_cli_refuses_an_out_that_is_a_file(tmp_path):
    out = tmp_path / "plots"
    out.write_text("")
    r = subprocess.run([sys.executable, TOOL, FIXTURE, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{out} exists and is not a directory" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
