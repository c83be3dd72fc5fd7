"""The original bot's callers: SACLSTM_* variables and its file layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import dir_digests

from sacbot.store.checkpoint import read_checkpoint

pytestmark = pytest.mark.timeout(180)
SACBOT = [sys.executable, "-m", "sacbot"]
ORIGINAL_FIELDS = ("epoch", "steps", "buffer_size", "drained", "grad_steps", "critic_loss", "actor_loss",
                   "alpha_loss", "alpha")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SACBOT_", "SACLSTM_"))}
    return {**env, **kw}


def test_training_and_eval_through_the_original_interface(tmp_path):
    latest = tmp_path / "weights" / "sac_latest.zip"
    env = _env(SACLSTM_WEIGHTS_PATH=str(latest), SACLSTM_SAVE_INTERVAL="50", SACLSTM_UTD_RATIO="1",
               SACLSTM_BATCH_SIZE="8")
    args = ["run", "--env", "Pendulum-v1", "--steps", "600", "--pace", "lockstep", "--learning-starts", "100",
            "--hidden", "16", "--run-dir", str(tmp_path / "run"), "--quiet"]
    p = subprocess.run(SACBOT + args, capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # The checkpoint is exactly the file named; step files, receipts and the counter beside it.
    ck = read_checkpoint(str(latest))
    assert ck["meta"]["env_steps"] == 600 and ck["manifest"]["config"]["batch_size"] == 8
    names = set(os.listdir(latest.parent))
    assert {"sac_latest.zip", "round_counter.txt", "saves.jsonl"} <= names and not (latest.parent / "sac_latest.zip"
                                                                                      ).is_dir()
    assert int((latest.parent / "round_counter.txt").read_text()) == 3  # 600 steps of 200-step episodes
    # training_metrics.jsonl in the weights directory's parent, with the original's nine fields.
    lines = [json.loads(x) for x in open(tmp_path / "training_metrics.jsonl")]
    assert not (tmp_path / "run" / "training_metrics.jsonl").exists()
    assert all(f in lines[-1] for f in ORIGINAL_FIELDS)
    # The original's meanings: epoch is wall-clock seconds; a line only for a pass with gradient steps.
    epochs = [m["epoch"] for m in lines]
    assert epochs == sorted(epochs) and all(isinstance(e, float) and e > 1.7e9 for e in epochs)
    assert all(m["grad_steps"] >= 1 for m in lines)
    passes = [m["passes"] for m in lines]
    assert passes == sorted(set(passes)) and passes[0] >= 100  # the passes before learning_starts wrote nothing
    assert sum(m["drained"] for m in lines) < 600 and lines[-1]["buffer_size"] <= 600
    total = 0
    for m in lines:  # grad_steps is this pass's; steps is cumulative
        total += m["grad_steps"]
        assert m["steps"] == total
    assert total == 501 and lines[-1]["steps"] == ck["meta"]["grad_steps"]

    # Eval through the alias: eval mode, so no file in the weights dir changes and no metrics appear.
    before = dir_digests(latest.parent)
    n_lines = len(lines)
    env = _env(SACLSTM_EVAL_MODE="1", SACLSTM_WEIGHTS_PATH=str(latest))
    p = subprocess.run(SACBOT + ["run", "--env", "Pendulum-v1", "--episodes", "1", "--hidden", "16",
                                 "--run-dir", str(tmp_path / "eval-run"), "--quiet"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "EVAL MODE" in p.stderr and "eval: 1 episodes" in p.stdout
    assert dir_digests(latest.parent) == before
    assert len(open(tmp_path / "training_metrics.jsonl").readlines()) == n_lines
    assert not (tmp_path / "eval-run" / "episodes.jsonl").exists()
