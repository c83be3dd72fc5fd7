"""The benchmark tools' own arithmetic, at sizes that run in seconds (the figures themselves
are in BENCHMARKS.md; these check that what the tools print is what they measured)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.timeout(120)
def test_bench_capacity_reports_samples_and_bots_from_its_own_runs(tmp_path):
    jsonl = tmp_path / "runs.jsonl"
    p = subprocess.run([sys.executable, str(TOOLS / "bench_capacity.py"), "--batches", "2", "--seq-len", "4",
                        "--hidden", "8", "--burn-in", "0,2", "--rounds", "1", "--seconds", "0.2",
                        "--replay-ratios", "8,2", "--jsonl", str(jsonl)],
                       capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(out["summary"]) == {"cpu/t1/b2/bi0", "cpu/t1/b2/bi2"}
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [d["key"] for d in lines] == ["cpu/t1/b2/bi0", "cpu/t1/b2/bi2"]
    for d in lines:
        row = out["summary"][d["key"]]
        assert d["quant_phase"] == "training" and d["update"] > 0  # calibrated, then timed
        assert row["steps_per_s"] == {"update": d["update"], "sample+update": d["sample+update"]}
        samples = row["samples_per_s"]["sample+update"]
        assert samples == round(2 * 4 * d["sample+update"])
        assert row["bots_served"] == {"8": round(samples / (8 * 30), 1), "2": round(samples / (2 * 30), 1)}
    assert out["gpu_over_cpu"] == {}  # nothing but the CPU here


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (["--devices", ","], "names no device"),
    (["--devices", "cpu,tpu"], "device = 'tpu' is not accepted"),
    (["--batches", "0"], "expected integers >= 1"),
    (["--jsonl", "/nonexistent-dir/x.jsonl"], "cannot append"),
])
def test_bench_capacity_refuses_bad_arguments_before_measuring(args, says):
    p = subprocess.run([sys.executable, str(TOOLS / "bench_capacity.py"), *args], capture_output=True, text=True,
                       timeout=50)
    assert p.returncode == 2 and says in p.stderr, p.stderr
