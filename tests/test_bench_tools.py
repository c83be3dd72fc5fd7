"""The benchmark tools' own arithmetic, at sizes that run in seconds (the figures themselves
are in BENCHMARKS.md; these check that what the tools print is what they measured)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import load_tool

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.timeout(120)
def test_bench_capacity_reports_medians_samples_and_bots_from_its_own_runs(tmp_path):
    jsonl = tmp_path / "runs.jsonl"
    p = subprocess.run([sys.executable, str(TOOLS / "bench" / "capacity.py"), "--batches", "2", "--seq-len", "4",
                        "--hidden", "8", "--burn-in", "0,2", "--rounds", "2", "--seconds", "0.1",
                        "--replay-ratios", "8,2", "--jsonl", str(jsonl)],
                       capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    keys = ["cpu/t1/b2/bi0", "cpu/t1/b2/bi2"]
    assert list(out["summary"]) == keys
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [d["key"] for d in lines] == keys * 2  # rounds interleave the settings
    for key in keys:
        mine = [d for d in lines if d["key"] == key]
        assert all(d["quant_phase"] == "training" and d["update"] > 0 for d in mine)  # calibrated, then timed
        row = out["summary"][key]
        for mode in ("update", "sample+update"):
            assert row["steps_per_s"][mode] == pytest.approx((mine[0][mode] + mine[1][mode]) / 2)  # the median of 2
        samples = row["samples_per_s"]["sample+update"]
        assert samples == round(2 * 4 * row["steps_per_s"]["sample+update"])
        assert row["bots_served"] == {"8": round(samples / (8 * 30), 1), "2": round(samples / (2 * 30), 1)}
    # The progress lines show the same samples/s (with sampling) as the summary's runs.
    said = [line for line in p.stderr.splitlines() if line.startswith("round ")]
    assert len(said) == 4 and said[0].endswith(f"= {round(2 * 4 * lines[0]['sample+update']):,} samples/s")
    assert out["gpu_over_cpu"] == {}  # nothing but the CPU here


def test_gpu_rows_are_compared_with_cpu_rows_of_the_same_burn_in():
    def row(kind, threads, batch, burn_in, rate):
        return {"kind": kind, "threads": threads, "batch": batch, "burn_in": burn_in,
                "samples_per_s": {"sample+update": rate}}

    summary = {"cpu/t1/b256/bi0": row("cpu", 1, 256, 0, 100), "cpu/t8/b256/bi0": row("cpu", 8, 256, 0, 400),
               "cpu/t1/b256/bi8": row("cpu", 1, 256, 8, 80), "cpu/t8/b256/bi8": row("cpu", 8, 256, 8, 1000),
               "cuda/b256/bi0": row("gpu", 1, 256, 0, 2000), "cuda/b1024/bi8": row("gpu", 1, 1024, 8, 4000)}
    ratios = load_tool("bench/capacity").gpu_over_cpu(summary)
    assert ratios == {
        "cuda/b256/bi0": {"vs_cpu_1_thread_same_batch": 20.0, "vs_best_cpu": 5.0, "best_cpu": "cpu/t8/b256/bi0"},
        "cuda/b1024/bi8": {"vs_cpu_1_thread_same_batch": None, "vs_best_cpu": 4.0, "best_cpu": "cpu/t8/b256/bi8"},
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (["--devices", ","], "names no device"),
    (["--devices", "cpu,tpu"], "device = 'tpu' is not accepted"),
    (["--batches", "0"], "expected integers >= 1"),
    (["--jsonl", "/nonexistent-dir/x.jsonl"], "cannot append"),
])
def test_bench_capacity_refuses_bad_arguments_before_measuring(args, says):
    p = subprocess.run([sys.executable, str(TOOLS / "bench" / "capacity.py"), *args], capture_output=True, text=True,
                       timeout=50)
    assert p.returncode == 2 and says in p.stderr, p.stderr


# --- hostile input: one line naming what is wrong, no traceback, before any long work -------------
def tiny_run(d, env, *extra):
    """A real run's weights dir in seconds, with its step checkpoints."""
    subprocess.run([sys.executable, "-m", "sacbot", "run", "--env", env, *extra, "--pace", "lockstep", "--steps",
                    "30", "--hidden", "8", "--batch-size", "2", "--seq-len", "4", "--learning-starts", "4",
                    "--calib-updates", "2", "--burn-in", "0", "--save-interval", "10", "--keep-last", "10",
                    "--weights-path", str(d / "w"), "--run-dir", str(d / "run"), "--quiet"],
                   check=True, capture_output=True, timeout=100)
    return d / "w"


@pytest.fixture(scope="module")
def radar_w(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("radar"), "sacbot/TankDuelRadar-v0", "--env-kwargs", '{"max_ticks": 12}')


@pytest.fixture(scope="module")
def pendulum_w(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("pendulum"), "Pendulum-v1")


def run_tool(name, *args, **kw):
    p = subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)], capture_output=True,
                       text=True, timeout=100, **kw)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize("args, says", [
    (["--random", "nobody"], "--random: unknown opponent(s) nobody; known: sitting_duck"),
    (["--train", "--steps", "-5"], "--steps wants an integer >= 1"),
    (["--train", "--save-every", "0"], "--save-every wants an integer >= 1"),
    (["--train", "--jobs", "0"], "--jobs wants an integer >= 1"),
    (["--train", "--opponents", "nobody"], "--opponents: unknown opponent(s) nobody"),
    (["--train", "--env", "Pendulum-v1"], "--env wants one of sacbot/TankDuel-v0, sacbot/TankDuelRadar-v0"),
])
def test_bench_tankduel_refuses_bad_flags_before_training(args, says, tmp_path):
    p = run_tool("bench/tankduel", *args, "--episodes", "1", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []  # no training started


def test_bench_tankduel_shows_a_failed_training_runs_message_and_keeps_its_dir(tmp_path):
    # a seed the tool passes through, which sacbot run refuses
    p = run_tool("bench/tankduel", "--train", "--steps", "1", "--seed", "-1", "--opponents", "sitting_duck",
                 env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 2, p.stderr
    assert "training sacbot against sitting_duck (seed -1) failed (exit 2)" in p.stderr and "seed = -1" in p.stderr
    # kept, and named: a run that dies late holds checkpoints
    (kept,) = os.listdir(tmp_path)
    assert f"its files are in {tmp_path / kept}" in p.stderr


@pytest.mark.timeout(120)
def test_bench_tankduel_train_runs_each_variant_and_sums_up_their_last_points(tmp_path):
    # One seed: the means over seeds are test_bench_tankduel_finals_...'s, without training.
    p = run_tool("bench/tankduel", "--train", "--steps", "1100", "--save-every", "550", "--seed", "4",
                 "--jobs", "2", "--opponents", "sitting_duck", "--episodes", "1",
                 env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert len(re.findall(r"runs done", p.stderr)) == 2 and "2 of 2 runs done" in p.stderr, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert sorted(out["curves"]) == ["memoryless-sitting_duck-s4", "sacbot-sitting_duck-s4"]
    final = out["final"]["sitting_duck"]
    for variant in ("sacbot", "memoryless"):
        assert sorted(final[variant]) == ["4"]
        assert final[variant]["4"] == out["curves"][f"{variant}-sitting_duck-s4"][-1]["win_rate"]
    assert final["gap"] == pytest.approx(final["sacbot_mean"] - final["memoryless_mean"])


def test_bench_tankduel_finals_are_each_seeds_last_point_and_the_gap_over_the_control():
    bench = load_tool("bench/tankduel")

    def curve(*wins):
        return [{"actor": "int8", "win_rate": w} for w in wins]

    f = bench.finals({
        "sacbot-sitting_duck-s0": curve(0.1, 0.8), "sacbot-sitting_duck-s1": curve(0.9, 0.4),
        "memoryless-sitting_duck-s0": curve(0.2, 0.1), "memoryless-sitting_duck-s1": curve(0.0, 0.3),
        # the fp32 rows of a last checkpoint are not its int8 actor's result
        "sacbot-tracker-s0": curve(0.5, 0.95) + [{"actor": "fp32", "win_rate": 0.0}],
        "lstm": curve(1.0)})  # a name --train does not give is not a seed of anything
    sd = f["sitting_duck"]
    assert sd["sacbot"] == {"0": 0.8, "1": 0.4} and sd["memoryless"] == {"0": 0.1, "1": 0.3}
    assert sd["sacbot_mean"] == pytest.approx(0.6) and sd["gap"] == pytest.approx(0.4)
    assert f["tracker"] == {"sacbot": {"0": 0.95}, "sacbot_mean": 0.95} and set(f) == {"sitting_duck", "tracker"}


@pytest.mark.timeout(120)
def test_bench_learner_times_another_checkout_beside_this_one(tmp_path):
    """--against DIR times DIR's learner in the same rounds; a folder without sacbot's learner is
    refused by name.  The yardstick here is a stub: only the tool's plumbing is under test."""
    stub = tmp_path / "naive.py"
    stub.write_text('import json\nprint(json.dumps({"grad_steps_per_s": 10.0}))\n')
    sizes = ["--naive", stub, "--rounds", "1", "--seconds", "0.2", "--hidden", "8", "--batch", "2", "--seq-len", "4",
             "--obs-dim", "3", "--act-dim", "1"]
    p = run_tool("bench/learner", *sizes, "--against", tmp_path)
    assert p.returncode != 0 and "no sacbot/learning/sac.py there" in p.stderr, p.stderr
    p = run_tool("bench/learner", *sizes, "--against", TOOLS.parent)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["median_steps_per_s"]["naive"] == 10.0 and res["median_steps_per_s"]["against_on"] > 0


@pytest.mark.timeout(60)
def test_bench_cluster_refuses_a_capacity_part_without_the_yardstick_before_measuring(tmp_path):
    # The capacity part runs tools/bench/learner.py, which cannot run without the yardstick: refused
    # at the start, not after the Ray parts have run for minutes.
    for extra in ([], ["--naive", str(tmp_path / "missing.py")]):
        p = run_tool("bench/cluster", "--parts", "capacity", *extra)
        assert p.returncode == 2 and "needs the yardstick: --naive PATH" in p.stderr, p.stderr
        assert "capacity:" not in p.stderr  # nothing measured


@pytest.mark.timeout(120)
def test_bench_tankduel_refuses_runs_it_cannot_evaluate(pendulum_w, radar_w, tmp_path):
    p = run_tool("bench/tankduel", "--runs", f"a={pendulum_w}", "--episodes", "1")
    assert p.returncode == 2 and "--runs a:" in p.stderr and "trained on Pendulum-v1" in p.stderr, p.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "sac_step_5.zip").write_bytes(b"not a zip")
    p = run_tool("bench/tankduel", "--runs", f"b={bad}", "--episodes", "1")
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"bench_tankduel: {bad / 'sac_step_5.zip'}: unreadable checkpoint (BadZipFile: File is not a zip file)"]
    p = run_tool("bench/tankduel", "--runs", f"r={radar_w}", "--episodes", "1", "--eval-env-kwargs",
                 '{"observation": "full"}')
    assert p.returncode == 2 and "observation='full' changes what the actor trained with" in p.stderr, p.stderr


# Benchmarks no test runs rot unseen: a tool that reads an attribute the runtime no longer has
# (agent.snapshot, SaveSlot.held) dies before printing a figure.  Each runs here at a tiny size.
@pytest.mark.timeout(180)
@pytest.mark.parametrize("tool, args, check", [
    ("bench/acting", ["--calls", "50", "--ticks", "10", "--hidden", "8", "--rates", "200"],
     lambda r: r["act_idle"]["n"] == 50 and r["act_idle"]["p50_us"] > 0 and r["realtime"]["200tps"]["ticks"] == 10),
    ("bench/checkpoint", ["--hidden", "8", "--repeats", "1", "--blocks", "1", "--block-steps", "20", "--every", "10"],
     lambda r: r["saves"][0]["file_bytes"] > 0 and r["step_time_while_saving"][0]["saving"]["n"] == 20
     and r["step_time_while_saving"][0]["saves_written"] >= 1
     and set(r["step_time_while_saving"][0]["saving_p50_ms_by_step"]) == {"offer", "after_offer", "others"}),
    ("bench/env", ["--steps", "200", "--rounds", "1"], lambda r: r["median_steps_per_s"]["tankduel_raw"] > 0),
    ("bench/serve", ["--ticks", "40", "--warmup", "10", "--arms", "agent,python-tcp,python-unix"],
     lambda r: r["agent_act_in_process"]["n"] == 40 and r["python-tcp"]["n"] == 40
     and r["python-unix"]["p999_us"] >= r["python-unix"]["p50_us"] > 0),
    ("bench/serve", ["--ticks", "40", "--warmup", "10", "--arms", "python-tcp,python-unix", "--learner", "process"],
     lambda r: r["learner"] == "process" and r["python-tcp"]["n"] == r["python-unix"]["n"] == 40),
    # Two games, each its own process, 2 s at 30 ticks/s, on a shared learner in a process: every
    # step answered, and the learner took the games' transitions.
    # Then the same games against the yardstick server (--floor).
    ("bench/serve_many", ["--clients", "2", "--tps", "30", "--seconds", "2", "--games-as", "processes",
                          "--shared-learner", "--learner", "process", "--floor"],
     lambda r: r["games_failed"] == 0 and r["steps_answered"] == r["steps_sent"] and 110 <= r["steps_sent"] <= 122
     and r["learner_transitions_received"] >= r["steps_sent"] - 2 - 8
     and r["round_trip_ms_p50_p99_p999_max"][0] > 0 and r["server_rss_mb_first_minute"] > 0
     and r["floor"]["steps_answered"] == r["floor"]["steps_sent"] == r["steps_sent"]),
])
def test_each_benchmark_runs_at_smoke_size_and_prints_its_json_line(tool, args, check):
    # Its own temporary folder, which must be left empty: a benchmark run again and again must not fill the disk.
    # Short (in the system's temp folder, not pytest's deep one): the serve benches put Unix sockets there.
    with tempfile.TemporaryDirectory(prefix="sacbot-t-") as tmp:
        p = subprocess.run([sys.executable, str(TOOLS / f"{tool}.py"), *args], capture_output=True, text=True,
                           timeout=170, env={**os.environ, "TMPDIR": tmp})
        assert p.returncode == 0, p.stderr[-2000:]
        result = json.loads(p.stdout.strip().splitlines()[-1])
        assert check(result), result
        # torch keeps its compiler cache there (one folder, reused): not the benchmark's to remove
        assert [n for n in os.listdir(tmp) if not n.startswith("torchinductor_")] == []


@pytest.mark.timeout(60)
def test_the_one_thread_game_harness_plays_every_tick_of_every_game_on_its_clock(monkeypatch):
    # serve_many's --games-as loop, against its yardstick server (no bot, no torch): 3 games at 40
    # ticks/s for 1 s in episodes of 15 ticks, each on its own clock.
    import time

    bench = str(TOOLS / "bench")
    monkeypatch.syspath_prepend(bench)  # serve_many imports benchlib, its neighbour
    sm = load_tool("bench/serve_many")
    says_port = "class Port:\n    def put(self, port): print(port, flush=True)\n"
    server = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {bench!r}); import serve_many\n"
                               f"{says_port}serve_many.floor_server(Port())"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        out: dict = {}
        start = time.monotonic() + 0.3
        sm.game_loop(["a", "b", "c"], port, 40.0, 1.0, 15, out, [start, start + 0.008, start + 0.016])
    finally:
        server.kill()
        server.wait(10)
    assert sorted(out) == ["a", "b", "c"]
    for g in out.values():
        assert "error" not in g, g.get("error")
        assert g["sent"] == len(g["lateness_ms"]) == len(g["trip_ms"]) == 40  # every tick of 1 s, answered
        # lateness counts from the tick's scheduled start, so it is never below the round trip
        assert all(late >= trip >= 0 for late, trip in zip(g["lateness_ms"], g["trip_ms"], strict=True))


@pytest.mark.timeout(60)
def test_a_server_that_refuses_its_flags_is_named_with_its_reason_by_the_serve_benchmarks():
    p = subprocess.run([sys.executable, str(TOOLS / "bench" / "serve_many.py"), "--clients", "1", "--seconds", "1",
                        "--learning-starts", "500000"], capture_output=True, text=True, timeout=50)
    assert p.returncode != 0
    assert "sacbot serve did not start (exit 2): " in p.stderr and "learning_starts = 500000 is more than " \
           "buffer_size" in p.stderr, p.stderr


def test_the_fp32_twin_keeps_the_quantizers_ranges_and_drops_only_their_rounding():
    import numpy as np
    lb = load_tool("bench/learning")
    rng = np.random.default_rng(0)
    arrays = {"export.meta.sizes": np.array([3, 1, 4, 8]), "export.meta.bits": np.array(8)}
    shapes = {"fc1.w": (8, 4), "fc1.b": (8,), "lstm.w_ih": (16, 8), "lstm.w_hh": (16, 4), "lstm.b_ih": (16,),
              "lstm.b_hh": (16,), "fc2.w": (8, 4), "fc2.b": (8,), "head.w": (2, 8), "head.b": (2,)}
    for k, shape in shapes.items():
        arrays["actor." + lb._FP32_NAMES[k]] = rng.normal(size=shape).astype(np.float32)
        if k.endswith(".w"):
            arrays[f"export.{k}_scale"] = np.full(shape[0], 0.5 / 127, np.float32)  # each row's range: +-0.5
    for layer in ("fc1", "lstm", "fc2", "head"):
        arrays[f"export.{layer}.x_scale"], arrays[f"export.{layer}.x_range"] = np.float32(0.1), np.array([-127, 127])
    latent = arrays["actor.fc2.weight"]
    twin = lb.fp32_arrays(arrays)
    inside = np.abs(latent) <= 0.5
    assert (~inside).any() and inside.any()
    np.testing.assert_array_equal(twin["fc2.w"][inside], latent[inside])  # no rounding inside the range
    np.testing.assert_allclose(twin["fc2.w"][~inside], 0.5 * np.sign(latent[~inside]), rtol=1e-6)  # clamped
    assert twin["fc2.w_scale"].tolist() == [1.0] * 8 and twin["fc1.x_range"].tolist() == [-127 * 4096, 127 * 4096]
    np.testing.assert_allclose(twin["fc1.x_scale"] * twin["fc1.x_range"][1], 12.7, rtol=1e-6)  # the same input range
    bare = lb.fp32_arrays(arrays, clip=False)
    np.testing.assert_array_equal(bare["fc2.w"], latent)
    assert "fc2.w_scale" not in bare and "fc1.x_scale" not in bare


def test_the_robustness_suite_statistics():
    rb = load_tool("bench/robust")
    assert rb.iqm([1, 2, 3, 4, 100, -100, 5, 6]) == 3.5  # the middle half of 8: 2, 3, 4, 5
    assert rb.iqm([1, 2, 9]) == 4.0  # under 4 runs nothing is cut
    lo, hi = rb.bootstrap_ci([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert 0.0 <= lo < rb.iqm(range(8)) < hi <= 7.0
    rows = [{"task": "T", "view": v, "arm": arm, "seed": s, "return": ret}
            for v, arm, s, ret in [("full", "random", 0, -100.0), ("full", "sb3", 0, 0.0), ("full", "sb3", 1, 100.0),
                                   ("P", "sacbot", 0, -10.0), ("P", "sacbot", 1, -80.0)]]
    cell = rb.report(rows)["T P"]["sacbot"]
    assert cell["gap_closed"] == {0: 0.6, 1: 0.133} and cell["every_seed_closes_half"] is False
    assert cell["gap_iqm"] == round((0.6 + 0.1333) / 2, 3)
    assert cell["worst"] == {"seed": 1, "return": -80.0}
    assert "tail_gap_iqm" not in cell  # rows without a tail
    rows[3]["tail"], rows[4]["tail"] = [-30.0, -10.0], [-40.0, -80.0]  # tail means -20 (gap 0.533), -60 (0.267)
    assert rb.report(rows)["T P"]["sacbot"]["tail_gap_iqm"] == round((0.5333 + 0.2667) / 2, 3)


@pytest.mark.timeout(170)
def test_the_robustness_suite_appends_each_run_and_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "suite.jsonl"
    args = ("--tasks", "Pendulum-v1", "--views", "full", "F", "--arms", "sacbot", "random", "--steps", "200",
            "--seeds", "0", "--episodes", "1", "--out", out)
    with tempfile.TemporaryDirectory(prefix="sacbot-t-") as tmp:  # each run's folder is removed after it
        # two worker processes, the parent writes the rows
        p = run_tool("bench/robust", *args, "--jobs", "2", env={**os.environ, "TMPDIR": tmp})
        assert p.returncode == 0, p.stderr
        assert [n for n in os.listdir(tmp) if not n.startswith("torchinductor_")] == []
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted((r["view"], r["arm"]) for r in rows) == [("F", "random"), ("F", "sacbot"), ("full", "random"),
                                                          ("full", "sacbot")]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=TOOLS)
    assert {r["commit"].removesuffix("+dirty") for r in rows} == {head.stdout.strip() or "unknown"}
    assert all("cores)" in r["cpu"] for r in rows) and all(r["seconds"] > 0 for r in rows if r["arm"] == "sacbot")
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    assert rep["runs"] == 4 and rep["report"]["Pendulum-v1 F"]["sacbot"]["iqm"] == round(
        next(r["return"] for r in rows if (r["view"], r["arm"]) == ("F", "sacbot")), 2)
    again = run_tool("bench/robust", *args)  # everything is done: nothing runs, nothing is added
    assert again.returncode == 0 and "bench_robust: Pendulum" not in again.stderr
    assert len(out.read_text().splitlines()) == 4
    # a candidate default: its own arm's rows beside the defaults', its flags passed to sacbot
    one = ("--tasks", "Pendulum-v1", "--arms", "sacbot", *args[8:])
    cand = run_tool("bench/robust", *one, "--views", "full", "--candidate", "ri=--reward-input")
    assert cand.returncode == 0, cand.stderr
    assert [json.loads(x)["arm"] for x in out.read_text().splitlines()][4:] == ["sacbot+ri"]
    # the last checkpoints' evals: 150 gradient steps, saves every 40, so 80, 120 and the final one
    tail = run_tool("bench/robust", *one, "--views", "full", "--candidate", "ls=--learning-starts 50",
                    "--tail", "3", "--tail-every", "40")
    assert tail.returncode == 0, tail.stderr
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["arm"] == "sacbot+ls" and len(row["tail"]) == 3 and row["tail"][-1] == row["return"]
    assert row["tail_every"] == 40
    assert run_tool("bench/robust", *one, "--tail", "0").returncode == 2
    bad = run_tool("bench/robust", *one, "--views", "P", "--candidate", "x=--no-such-flag")
    assert bad.returncode != 0 and "--no-such-flag" in bad.stderr
    assert run_tool("bench/robust", *args, "--candidate", "reward input").returncode == 2


def _curve_run(root: Path, arm: str, points: list[tuple[int, int, int]], opponents=("sample.SittingDuck",)) -> None:
    """A curve.jsonl of (battles, wins, rounds) points against each opponent."""
    root.mkdir()
    with open(root / "curve.jsonl", "w") as f:
        for battles, wins, rounds in points:
            for o in opponents:
                f.write(json.dumps({"arm": arm, "seed": "0", "battles": battles, "train_rounds": 50 * battles,
                                    "env_steps": 9000 * battles, "opponent": o, "rounds": rounds,
                                    "wins": wins}) + "\n")


@pytest.mark.timeout(120)
def test_robocode_curves_pool_each_arms_last_points_and_draw_them(tmp_path):
    two = ("sample.SittingDuck", "sample.Walls")
    _curve_run(tmp_path / "a0", "sacbot", [(12, 1, 10), (24, 18, 20)], two)   # the last point counts, not the first
    _curve_run(tmp_path / "a1", "sacbot", [(12, 3, 10), (20, 14, 20)], two)
    _curve_run(tmp_path / "m0", "memoryless", [(12, 9, 10), (24, 4, 20)], two)
    png = tmp_path / "img" / "c.png"
    p = run_tool("bench/robocode_curves", tmp_path / "a0", tmp_path / "a1", tmp_path / "m0", "--out", png)
    assert p.returncode == 0, p.stderr
    f = json.loads(p.stdout.strip().splitlines()[-1])["finals"]
    assert f["sacbot"]["by_opponent"]["sample.Walls"] == {"wins": 32, "rounds": 40, "rate": 0.8}
    assert (f["sacbot"]["wins"], f["sacbot"]["rounds"], f["memoryless"]["wins"], f["memoryless"]["rounds"]) == (
        64, 80, 8, 40)
    d = f["difference"]
    assert d["sacbot_minus_memoryless"] == 0.6 and d["se"] == round((0.8 * 0.2 / 80 + 0.2 * 0.8 / 40) ** 0.5, 3)
    assert d["beyond_2_se"] is True
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_robocode_curves_name_a_root_that_is_not_a_curve(tmp_path):
    p = run_tool("bench/robocode_curves", tmp_path)
    assert p.returncode == 2 and "no curve.jsonl (made by tools/bench/robocode.py --curve-every N)" in p.stderr
    (tmp_path / "curve.jsonl").write_text('{"arm": "sacbot"}\n')
    p = run_tool("bench/robocode_curves", tmp_path)
    assert p.returncode == 2 and "curve.jsonl:1: a curve point needs battles, train_rounds" in p.stderr, p.stderr
    (tmp_path / "curve.jsonl").write_text("[1,\n")
    p = run_tool("bench/robocode_curves", tmp_path)
    assert p.returncode == 2 and "curve.jsonl:1: not JSON" in p.stderr, p.stderr
