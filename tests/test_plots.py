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
