"""--tensorboard: the JSONL files' numbers as TensorBoard scalars, read back with tensorboard's
own EventAccumulator.  Skipped where the tensorboard extra is not installed, except
the test of the error that names the extra."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from sacbot.config import ConfigError

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "run_small")
needs_tb = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                              reason="the tensorboard extra is not installed (pip install 'sacbot[tensorboard]')")


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


@needs_tb
@pytest.mark.timeout(60)
def test_the_sink_writes_what_is_appended_after_it_starts_and_reads_back(tmp_path):
    from sacbot.app.tensorboard import TensorBoardSink

    run = tmp_path / "run"
    run.mkdir()
    (run / "episodes.jsonl").write_text('{"episode": 99, "return": 5.0, "time": 1.0}\n')  # an earlier run's
    files = {"train": str(run / "training_metrics.jsonl"), "episodes": str(run / "episodes.jsonl"),
             "evals": str(run / "evals.jsonl")}
    sink = TensorBoardSink(str(tmp_path / "tb"), files, poll_s=0.01)
    sink.start()
    try:
        for name in ("training_metrics.jsonl", "episodes.jsonl", "evals.jsonl"):
            data = open(os.path.join(FIXTURE, name)).read()
            half = len(data) // 2 + 7  # mid-line: the sink must wait for the rest of that line
            with open(run / name, "a") as fh:
                fh.write(data[:half])
                fh.flush()
                fh.write(data[half:])
        with open(run / "episodes.jsonl", "a") as fh:
            fh.write("not json\n")
    finally:
        assert sink.stop(timeout=20)
    assert sink.error is None
    tb = read_scalars(tmp_path / "tb")

    mets = jsonl(os.path.join(FIXTURE, "training_metrics.jsonl"))
    learned = [m for m in mets if "critic_loss" in m]
    assert tb["train/critic_loss"] == [(m["grad_steps"], pytest.approx(m["critic_loss"])) for m in learned]
    assert tb["train/alpha"][-1] == (learned[-1]["grad_steps"], pytest.approx(learned[-1]["alpha"]))
    assert len(tb["train/drops/transition"]) == len(mets)

    eps = jsonl(os.path.join(FIXTURE, "episodes.jsonl"))
    assert tb["episode/return"] == [(e["episode"], pytest.approx(e["return"])) for e in eps]  # not episode 99
    assert tb["latency/act_p99_us"] == [(e["episode"], pytest.approx(e["act_p99_us"])) for e in eps]
    avg = [sum(e["return"] for e in eps[: i + 1]) / (i + 1) for i in range(len(eps))]
    assert [v for _, v in tb["episode/return_avg20"]] == pytest.approx(avg)

    evals = jsonl(os.path.join(FIXTURE, "evals.jsonl"))
    assert tb["eval/mean_return"] == [(e["rounds"], pytest.approx(e["mean_return"])) for e in evals]
    assert [s for s, _ in tb["eval/-/std_return"]] == [e["rounds"] for e in evals]
    assert sink.tails[1][0].bad == 1  # the line that was not JSON, counted and skipped


@needs_tb
def test_win_rates_come_per_window_and_per_opponent():
    from sacbot.app.tensorboard import Scalars

    sc = Scalars()
    rows = []
    for i, (opp, won) in enumerate([("duck", True), ("duck", False), ("walker", True), ("duck", True)], 1):
        rows += sc.episode({"episode": i, "return": float(i), "opponent": opp, "won": won, "time": 1.0})
    by_tag: dict[str, list] = {}
    for step, _, tag, value in rows:
        by_tag.setdefault(tag, []).append((step, value))
    assert by_tag["episode/win_rate_last20"] == [(1, 1.0), (2, 0.5), (3, pytest.approx(2 / 3)), (4, 0.75)]
    assert by_tag["opponent/duck/win_rate_last20"] == [(1, 1.0), (2, 0.5), (4, pytest.approx(2 / 3))]
    assert by_tag["opponent/walker/return"] == [(3, 3.0)]
    assert by_tag["episode/won"] == [(1, 1.0), (2, 0.0), (3, 1.0), (4, 1.0)]


@needs_tb
@pytest.mark.timeout(120)
def test_a_cli_run_with_tensorboard_writes_its_metrics_and_episodes_as_scalars(tmp_path):
    tb = tmp_path / "tb"
    p = subprocess.run([sys.executable, "-m", "sacbot", "run", "--env", "Pendulum-v1", "--steps", "450",
                        "--learning-starts", "100", "--hidden", "8", "--batch-size", "4", "--seq-len", "8",
                        "--pace", "lockstep", "--run-dir", str(tmp_path / "run"), "--weights-path",
                        str(tmp_path / "w"), "--quiet", "--tensorboard", str(tb)],
                       capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stderr
    scalars = read_scalars(tb)
    mets = [m for m in jsonl(tmp_path / "run" / "training_metrics.jsonl") if "critic_loss" in m]
    eps = jsonl(tmp_path / "run" / "episodes.jsonl")
    assert mets and eps
    # Every line the run wrote, including the last ones written at close.
    step = [m["steps"] if "steps" in m else m["grad_steps"] for m in mets]  # cumulative (docs/reference.md)
    assert scalars["train/critic_loss"] == [(s, pytest.approx(m["critic_loss"])) for s, m in zip(step, mets)]
    assert scalars["episode/return"] == [(e["env_steps"], pytest.approx(e["return"])) for e in eps]  # global_step
    assert [s for s, _ in scalars["latency/act_p50_us"]] == [e["env_steps"] for e in eps]


@pytest.mark.timeout(60)
def test_without_the_extra_tensorboard_is_a_config_error_naming_it(tmp_path):
    # sys.modules[name] = None makes any import of it fail, as if it were not installed.
    code = ("import sys; sys.modules['tensorboard'] = None; from sacbot.app.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", code, "run", "--run-dir", str(tmp_path / "run"), "--weights-path",
                        str(tmp_path / "w"), "--quiet", "--tensorboard", str(tmp_path / "tb")],
                       capture_output=True, text=True, timeout=50)
    assert p.returncode == 2, p.stderr
    assert "configuration error" in p.stderr and "pip install 'sacbot[tensorboard]'" in p.stderr
    assert not os.path.exists(tmp_path / "w") and not os.path.exists(tmp_path / "tb")  # nothing touched


@needs_tb
def test_a_file_where_the_tensorboard_dir_should_be_is_a_config_error(tmp_path):
    from sacbot.app.tensorboard import TensorBoardSink

    (tmp_path / "tb").write_text("mine")
    with pytest.raises(ConfigError, match="a file is in the way"):
        TensorBoardSink(str(tmp_path / "tb"), {})
    assert (tmp_path / "tb").read_text() == "mine"



@needs_tb
def test_a_line_still_being_written_waits_for_its_end_and_a_truncated_file_is_read_again(tmp_path):
    from sacbot.app.tensorboard import JsonlTail

    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n')
    tail = JsonlTail(str(path))  # from the end: the earlier line is not read
    with open(path, "a") as fh:
        fh.write('{"a": 2, "b"')
    assert tail.read() == []
    with open(path, "a") as fh:
        fh.write(': 3}\n{"a": 4}\n')
    assert tail.read() == [{"a": 2, "b": 3}, {"a": 4}]
    path.write_text('{"a": 5}\n')  # replaced by a shorter file
    assert tail.read() == [{"a": 5}]
    assert JsonlTail(str(tmp_path / "absent.jsonl")).read() == []
