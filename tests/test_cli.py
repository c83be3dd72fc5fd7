"""The CLI in real subprocesses: signals, determinism, config errors, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import StderrWatcher, read_status, wait_until

from sacbot.config import ConfigError, load_config
from sacbot.store.checkpoint import read_checkpoint

SACBOT = [sys.executable, "-m", "sacbot"]


def run_args(tmp, *extra):
    return ["run", "--run-dir", str(tmp / "run"), "--weights-path", str(tmp / "w"), "--quiet", *extra]


@pytest.mark.timeout(90)
def test_sigterm_makes_a_final_checkpoint_that_loads(tmp_path):
    p = subprocess.Popen(SACBOT + run_args(tmp_path, "--env", "Pendulum-v1", "--learning-starts", "64",
                                           "--save-interval", "100000"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line("learning started", 60)
        wait_until(lambda: read_status(tmp_path / "run").get("learner_steps", 0) >= 1, 60, "a gradient step")
        assert not os.path.exists(tmp_path / "w" / "sac_latest.zip")  # only the final save writes
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
        assert time.monotonic() - t0 < 10
    finally:
        p.kill()
    err = watch.rest(5)
    assert p.returncode == 0, err
    ck = read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))
    assert ck["meta"]["grad_steps"] >= 1 and len(ck["arrays"]["replay.obs"]) == ck["meta"]["env_steps"]
    assert "SIGTERM" in err


@pytest.mark.timeout(60)
def test_second_signal_exits_at_once(tmp_path):
    # hidden 1024: each gradient step and the final save take long enough (~1 s) that the
    # second signal, sent once the first one's message is out, lands during the close.  (Two
    # signals sent back to back are merged into one by the kernel, which let this test pass with 0.)
    p = subprocess.Popen(SACBOT + run_args(tmp_path, "--env", "Pendulum-v1", "--learning-starts", "64",
                                           "--hidden", "1024"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = StderrWatcher(p)
    try:
        watch.wait_line("learning started", 50)
        p.send_signal(signal.SIGINT)
        watch.wait_line("closing (final save)", 20)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGINT, watch.rest(5)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_lockstep_runs_are_deterministic_with_either_learner(tmp_path):
    """The same seed, side by side: thread, process and thread again give identical metrics and
    identical weights (both learners behind the boundary compute the same run)."""
    runs = {"a": "thread", "b": "process", "c": "thread"}
    procs = []
    for name, kind in runs.items():
        d = tmp_path / name
        procs.append(subprocess.Popen(SACBOT + run_args(d, "--env", "Pendulum-v1", "--pace", "lockstep",
                                                        "--steps", "420", "--learning-starts", "300",
                                                        "--calib-updates", "60", "--seed", "0", "--learner", kind),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=220)
        assert p.returncode == 0, err

    def metrics(name):
        with open(tmp_path / name / "run" / "training_metrics.jsonl") as fh:
            lines = [json.loads(x) for x in fh]
        for line in lines:
            line.pop("wall_time")
        return lines

    a, b, c = metrics("a"), metrics("b"), metrics("c")
    assert len(a) == 420 and a[-1]["steps"] == 121
    # fp32 for the first 60 updates (--calib-updates 60), fake-quantized after: both are compared
    assert a[0]["quant_phase"] == "calibrating" and a[-1]["quant_phase"] == "training"
    assert a == b == c
    digests = {n: read_checkpoint(str(tmp_path / n / "w" / "sac_latest.zip"))["manifest"]["entries"]
               ["model.msgpack.zst"]["sha256"] for n in runs}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("args,env,needle", [
    (["--utd-ratio", "fast"], {}, "--utd-ratio = 'fast'"),
    (["--pace", "warp"], {}, "pace = 'warp'"),
    ([], {"SACBOT_BATCH_SIZE": "0"}, "batch_size = 0"),
    ([], {"SACBOT_EVAL_MODE": "maybe"}, "SACBOT_EVAL_MODE = 'maybe'"),
    ([], {"SACBOT_UTD_RATO": "1"}, "unknown environment variable SACBOT_UTD_RATO"),
    (["--env-kwargs", "{bad json"], {}, "env_kwargs = '{bad json'"),
    (["--device", "gpu0"], {}, "device = 'gpu0'"),
])
def test_bad_config_exits_2_and_names_the_setting(tmp_path, args, env, needle):
    p = subprocess.run(SACBOT + run_args(tmp_path, *args), capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert p.returncode == 2
    assert needle in p.stderr and "expected" in p.stderr or "known" in p.stderr


def test_an_eval_that_finishes_no_episode_exits_1_and_says_so(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for weights/pretrained/
    p = subprocess.run(SACBOT + ["eval", "--steps", "5", "--run-dir", str(tmp_path / "r"), "--quiet"],
                       capture_output=True, text=True, timeout=60, cwd=repo)
    assert p.returncode == 1 and "no episode finished in 5 env steps" in p.stdout
    p = cli(tmp_path, "eval", "--no-eval", "--run-dir", str(tmp_path / "r2"), "--quiet", cwd=repo)  # was ignored
    assert p.returncode == 2 and "--no-eval is not accepted by sacbot eval" in p.stderr


@pytest.mark.timeout(90)
def test_an_eval_interrupted_before_any_episode_says_so_and_exits_130(tmp_path):
    # It said "closing (final save)", then "give it more --steps, or use --episodes", exit 1.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for weights/pretrained/
    run = tmp_path / "r"
    p = subprocess.Popen(SACBOT + ["eval", "--episodes", "3", "--pace", "realtime", "--tps", "30", "--run-dir",
                                   str(run), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=repo)
    try:
        wait_until(lambda: json.loads((run / "status.json").read_text())["ticks"] > 0, 60, "the eval to play")
        p.send_signal(signal.SIGINT)  # a 600-tick episode takes 20 s at 30 ticks/s
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "SIGINT: stopping (eval saves nothing)" in err and "final save" not in err
    assert "eval: interrupted before any episode finished" in out and "--steps" not in out


def test_config_precedence_toml_env_flags(tmp_path):
    toml = tmp_path / "bot.toml"
    toml.write_text("utd_ratio = 2.0\nbatch_size = 8\nsave_interval = 10\n")
    env = {"SACBOT_BATCH_SIZE": "12", "SACBOT_SAVE_INTERVAL": "20"}
    cfg = load_config(str(toml), env, {"save_interval": "30"})
    assert (cfg.utd_ratio, cfg.batch_size, cfg.save_interval) == (2.0, 12, 30)
    cfg = load_config(None, {"SACBOT_EVAL_MODE": "1", "SACBOT_WEIGHTS_PATH": "/x"}, {})
    assert cfg.eval_mode and cfg.weights_path == "/x"
    toml.write_text("utd_ratoi = 2\n")
    with pytest.raises(ConfigError, match="unknown key 'utd_ratoi'"):
        load_config(str(toml), {}, {})


def test_help_works_on_every_subcommand():
    for sub in ([], ["run"], ["eval"], ["inspect"], ["status"]):
        p = subprocess.run(SACBOT + sub + ["--help"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "usage: sacbot" in p.stdout
    p = subprocess.run(SACBOT + ["run", "--help"], capture_output=True, text=True, timeout=60)
    assert "SACBOT_UTD_RATIO" in p.stdout and "--eval" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exact_resume_matches_an_uninterrupted_run(tmp_path):
    """N steps (a whole number of episodes), resume for M more, against N + M in one go: the final
    parameters and optimizer state are bitwise identical (compared by entry digests).  (A SIGTERM
    closes lockstep mid-episode, so the first leg ends by --steps.)"""
    small = ["--env", "Pendulum-v1", "--pace", "lockstep", "--seed", "3", "--hidden", "16", "--batch-size", "4",
             "--seq-len", "8", "--learning-starts", "100", "--calib-updates", "50", "--save-interval", "100000"]
    a, b = tmp_path / "a", tmp_path / "b"
    n, m = 200, 150  # a Pendulum episode, then part of one
    # The uninterrupted run shares nothing with the other two: it runs beside them (the suite's time).
    whole = subprocess.Popen(SACBOT + run_args(b, *small, "--steps", str(n + m)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        r = subprocess.run(SACBOT + run_args(a, *small, "--steps", str(n)), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert read_checkpoint(str(a / "w" / "sac_latest.zip"))["meta"]["env_steps"] == n
        r = subprocess.run(SACBOT + run_args(a, *small, "--steps", str(m)), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "loaded checkpoint" in r.stderr, r.stderr
        _, err = whole.communicate(timeout=120)
    finally:
        whole.kill()
    assert whole.returncode == 0, err
    ca = read_checkpoint(str(a / "w" / "sac_latest.zip"))
    cb = read_checkpoint(str(b / "w" / "sac_latest.zip"))
    assert ca["meta"]["env_steps"] == cb["meta"]["env_steps"] == n + m
    for entry in ("model.msgpack.zst", "optimizer.msgpack.zst"):
        assert ca["manifest"]["entries"][entry]["sha256"] == cb["manifest"]["entries"][entry]["sha256"], entry


# --- a clear error (exit 2 for settings, 1 for the rest), no traceback ------------------------
def cli(tmp_path, *args, env=None, cwd=None):
    p = subprocess.run(SACBOT + list(args), capture_output=True, text=True, timeout=60,
                       env={**os.environ, **(env or {})}, cwd=cwd)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    return p


def _toml_file(tmp_path, data: bytes) -> str:
    p = tmp_path / "bot.toml"
    p.write_bytes(data)
    return str(p)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make_args,needle", [
    (lambda t: ["--config", str(t)], "is a directory: expected a TOML file"),
    (lambda t: ["--config", _toml_file(t, b"hidden = 32 # \xff\n")], "is not UTF-8"),
    (lambda t: ["--config", _toml_file(t, b"sacbot = 5\n")], "sacbot = 5 is not accepted: expected a [sacbot] table"),
    (lambda t: ["--config", _toml_file(t, b"hidden = 32\n[sacbot]\nseq_len = 8\n")],
     "top-level keys hidden beside the [sacbot] table"),
    (lambda t: ["--seed", "18446744073709551615"], "seed = 18446744073709551615 is not accepted: expected an "
                                                    "integer in [0, 2**63 - 1]"),
    (lambda t: ["--hidden", "100000"], "hidden = 100000 is not accepted: expected an integer in [1, 1024]"),
    (lambda t: ["--buffer-size", "1e10"], "--buffer-size = '1e10' is not accepted: expected an integer in "
                                          "[1, 10,000,000] written out in digits"),
    (lambda t: ["--config", _toml_file(t, b"buffer_size = 1e10\n")],
     "buffer_size = 10000000000 is not accepted: expected an integer in [1, 10,000,000]"),
    (lambda t: ["--torch-threads", "100000"], "torch_threads = 100000 is not accepted: expected an integer in "
                                              "[1, 256]"),
    # As the newest-checkpoint name a step file was overwritten by the next save; a directory named
    # *.zip was moved aside as a corrupt checkpoint and a fresh bot started beside it.
    # Settings under which no gradient step could ever run: they played on with 0 steps, exit 0.
    (lambda t: ["--learning-starts", "5000", "--buffer-size", "100"], "learning_starts = 5000 is more than "
                                                                       "buffer_size = 100"),
    (lambda t: ["--batch-size", "64", "--buffer-size", "10", "--learning-starts", "5"], "needs 64 stored "
                                                                                       "transitions"),
    (lambda t: ["--weights-path", str(t / "w" / "sac_step_1.zip")], "it names a step checkpoint, which the next "
                                                                   "save would overwrite"),
])
def test_bad_settings_exit_2_with_one_clear_line(tmp_path, make_args, needle):
    p = cli(tmp_path, *run_args(tmp_path, *make_args(tmp_path)))
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "run").exists()  # nothing written


@pytest.mark.timeout(60)
def test_a_weights_directory_named_like_a_checkpoint_file_is_refused_and_left_as_it_was(tmp_path):
    bot = tmp_path / "bot.zip"
    bot.mkdir()
    (bot / "sac_latest.zip").write_bytes(b"a trained bot")
    p = cli(tmp_path, "run", "--run-dir", str(tmp_path / "run"), "--weights-path", str(bot), "--quiet")
    assert p.returncode == 2 and "it is a directory, not a checkpoint file" in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["bot.zip"] and os.listdir(bot) == ["sac_latest.zip"]


@pytest.mark.timeout(60)
def test_a_bad_env_kwarg_is_a_config_error_before_any_checkpoint(tmp_path):
    p = cli(tmp_path, *run_args(tmp_path, "--env", "Pendulum-v1", "--env-kwargs", '{"g": "abc"}'))
    assert p.returncode == 2, p.stderr
    assert "env = 'Pendulum-v1' with env_kwargs = {\"g\": \"abc\"} fails at step: TypeError" in p.stderr
    assert not (tmp_path / "w").exists()  # before: a step-0 checkpoint, then a TypeError traceback


@pytest.mark.timeout(60)
def test_the_originals_variables_lose_to_sacbots_and_say_so(tmp_path):
    p = cli(tmp_path, *run_args(tmp_path, "--pace", "warp"),
            env={"SACLSTM_UTD_RATIO": "2", "SACBOT_UTD_RATIO": "3", "SACLSTM_OTHER": "ignored"})
    assert p.returncode == 2 and "pace = 'warp'" in p.stderr
    assert ("sacbot: both SACLSTM_UTD_RATIO='2' and SACBOT_UTD_RATIO='3' are set; using SACBOT_UTD_RATIO "
            "(SACBOT_* names win)") in p.stderr.splitlines()


@pytest.mark.timeout(60)
def test_run_says_which_preset_it_applied(tmp_path):
    # The env check then refuses the kwargs, so nothing heavier than the config runs.
    bad = ["--env-kwargs", '{"opponents": ["nobody"]}']
    p = cli(tmp_path, *run_args(tmp_path, "--env", "sacbot/TankDuel-v0", *bad))
    assert p.returncode == 2
    said = "sacbot: preset for sacbot/TankDuel-v0: init_alpha=0.02, n_step=5, burn_in=8 (settings you give override it)"
    assert said in p.stderr.splitlines(), p.stderr
    p = cli(tmp_path, *run_args(tmp_path, "--env", "Pendulum-v1", "--env-kwargs", '{"g": "abc"}'))
    assert "sacbot: no preset for Pendulum-v1: sacbot's defaults apply" in p.stderr.splitlines()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content,needle", [
    ("[1, 2, 3]", "holds a JSON list, expected an object"),
    ('{"time": "yesterday"}', "time = 'yesterday', expected a number"),
    ('{"time": 1e9, "episodes": "many"}', "episodes = 'many', expected an integer"),
    ('{"time": 1e9, "drops": [1]}', "drops = [1], expected an object of counts"),
    ('{"time": 1e9, "last_save": "now"}', "last_save = 'now'"),
    ("{not json", "not valid JSON"),
])
def test_status_on_a_malformed_heartbeat_exits_1_and_says_why(tmp_path, content, needle):
    (tmp_path / "status.json").write_text(content)
    p = cli(tmp_path, "status", str(tmp_path))
    assert p.returncode == 1 and needle in p.stdout, p.stdout


@pytest.mark.timeout(60)
def test_sigint_during_start_up_exits_130_with_one_line(tmp_path):
    """SIGINT while the config is read (here from a FIFO that the test holds open without
    writing, so the child is certainly still starting up): one line, exit 130."""
    fifo = tmp_path / "bot.toml"
    os.mkfifo(fifo)
    # A suite started in the background without job control (`make test &`) has SIGINT ignored,
    # and an ignored signal stays ignored across exec, so the child would never see this one: it
    # is given the default, as a shell in the foreground gives it.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen(SACBOT + run_args(tmp_path, "--config", str(fifo)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    fd = None
    try:
        # A blocking open for writing returns exactly when the child opens the FIFO to read it:
        # the child is then inside its config read.  On a thread, so a child that never gets
        # there fails the test at the join's deadline instead of hanging it.
        opened: list[int] = []
        opener = threading.Thread(target=lambda: opened.append(os.open(fifo, os.O_WRONLY)), daemon=True)
        opener.start()
        opener.join(30)
        assert opened, "the child never opened the config"
        fd = opened[0]
        p.send_signal(signal.SIGINT)
        # Then end the config with EOF.  A signal that lands after the child's open() but before
        # its read() syscall is only flagged (the C handler ran, no read was there to interrupt),
        # and Python acts on the flag at its next bytecode check, so the read must return for
        # it (the likely cause of a CI run that hung here 30 s).  Either way the interrupt is handled
        # before anything after the config read runs.
        os.close(fd)
        fd = None
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
        if fd is not None:
            os.close(fd)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == ["sacbot: interrupted during start-up; nothing was saved"]


@pytest.mark.timeout(150)
def test_the_radar_duel_v1_keeps_its_critic_values_from_the_actor(tmp_path):
    """TankDuelRadar-v1 declares its last 14 observation values critic-only: `sacbot run` sets
    critic_obs from the env, so the saved actor reads the 32 radar values (+ 4 previous actions);
    a conflicting --critic-obs, or reward_input beside it, is exit 2 with nothing written."""
    small = ["--env", "sacbot/TankDuelRadar-v1", "--pace", "lockstep", "--hidden", "8", "--batch-size", "2",
             "--seq-len", "4", "--learning-starts", "8", "--calib-updates", "2"]
    p = subprocess.run(SACBOT + run_args(tmp_path, *small, "--steps", "40"), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    saved = read_checkpoint(str(tmp_path / "w" / "sac_latest.zip"))
    assert saved["manifest"]["config"]["critic_obs"] == 14 and saved["manifest"]["spaces"]["obs_dim"] == 46
    assert saved["arrays"]["export.fc1.w"].shape == (8, 32 + 4)
    p = subprocess.run(SACBOT + ["eval", "--env", "sacbot/TankDuelRadar-v1", "--weights-path", str(tmp_path / "w"),
                                 "--run-dir", str(tmp_path / "eval"), "--episodes", "1", "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "critic_obs=14" in p.stderr, p.stderr
    for extra, says in ((["--critic-obs", "3"], "declares its last 14 observation values critic-only"),
                        (["--reward-input"], "computed from state the actor must not see")):
        d = tmp_path / extra[0].strip("-")
        p = subprocess.run(SACBOT + run_args(d, *small, *extra), capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr, p.stderr
        assert not (d / "w").exists()


def test_an_env_declares_what_the_actor_must_not_read_and_a_flag_cannot_undo_it():
    import gymnasium as gym

    import sacbot.envs  # noqa: F401 - registers
    from sacbot.acting.games import with_env_critic_obs
    from sacbot.config import Config

    v1 = gym.make("sacbot/TankDuelRadar-v1")
    assert with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v1"), v1).critic_obs == 14
    with pytest.raises(ConfigError, match="declares its last 14 observation values critic-only"):
        with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v1", critic_obs=3), v1)
    plain = Config(env="sacbot/TankDuelRadar-v0", critic_obs=2)  # an env that declares nothing: as given
    assert with_env_critic_obs(plain, gym.make("sacbot/TankDuelRadar-v0")) is plain
    # A reward shaped from hidden state would reach the actor as reward_input's extra input.
    shaped = gym.make("sacbot/TankDuelRadar-v0", shaping=True)
    with pytest.raises(ConfigError, match="reward_input = True, but .* computed from state the actor must not see"):
        with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v0", reward_input=True), shaped)
    assert with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v0"), shaped).critic_obs == 0



def test_a_critic_without_memory_or_values_of_its_own_is_warned_about(caplog):
    """v1's preset turns critic_memory off because the env hands the critic the hidden state;
    with critic_info off that reason is gone, and the critic saw only the partial view."""
    import gymnasium as gym

    import sacbot.envs  # noqa: F401 - registers
    from sacbot.acting.games import with_env_critic_obs
    from sacbot.config import Config

    bare = gym.make("sacbot/TankDuelRadar-v1", critic_info=False)
    with caplog.at_level("WARNING", logger="sacbot"):
        with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v1", critic_memory=False), bare)
    assert "critic sees neither the history nor the hidden state" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sacbot"):
        v1 = gym.make("sacbot/TankDuelRadar-v1")
        with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v1", critic_memory=False), v1)
        with_env_critic_obs(Config(env="sacbot/TankDuelRadar-v1", critic_memory=False, memoryless=True), bare)
    assert caplog.text == ""


@pytest.mark.timeout(120)
def test_a_bot_is_not_resumed_or_evaluated_in_another_game_unless_transfer_is_given(tmp_path):
    """The end to end of checkpoint.game_difference: a TankDuel bot that learnt to aim (gun_control
    "aim") must not be trained on, or played, with the raw gun turn; --transfer lets eval play it,
    here from a best.zip (which eval reads and training refuses)."""
    import hashlib
    import shutil

    small = ["--hidden", "16", "--learning-starts", "10", "--batch-size", "2", "--save-interval", "10",
             "--pace", "lockstep"]
    p = subprocess.run(SACBOT + run_args(tmp_path, "--steps", "30", *small), capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr
    w = tmp_path / "w"
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in w.iterdir() if f.suffix == ".zip"}
    turn = '{"gun_control": "turn", "max_ticks": 20}'
    p = subprocess.run(SACBOT + run_args(tmp_path, "--steps", "30", "--env-kwargs", turn, *small),
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 2 and "played sacbot/TankDuel-v0 with gun_control='aim', this run has " \
        "gun_control='turn'" in p.stderr and "--transfer" in p.stderr, p.stderr
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in w.iterdir() if f.suffix == ".zip"} == files
    (tmp_path / "b").mkdir()
    shutil.copy(w / "sac_latest.zip", tmp_path / "b" / "best.zip")
    ev = ["eval", "--run-dir", str(tmp_path / "ev"), "--weights-path", str(tmp_path / "b" / "best.zip"),
          "--episodes", "1", "--env-kwargs", turn, "--hidden", "16"]
    p = subprocess.run(SACBOT + ev, capture_output=True, text=True, timeout=90)
    assert p.returncode == 2 and "gun_control='turn'" in p.stderr, p.stderr
    p = subprocess.run(SACBOT + ev + ["--transfer", "--json"], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["episodes"] == 1


@pytest.mark.timeout(180)
def test_the_originals_launch_gets_its_metrics_contract_and_save_interval(tmp_path):
    """As the original's campaign scripts read it: training_metrics.jsonl beside the weights
    directory, epoch in wall-clock seconds, one line per pass that took gradient steps and none for
    an idle pass; its default save interval, 500."""
    weights = tmp_path / "weights" / "sac_latest.zip"
    t0 = time.time()
    p = subprocess.run(SACBOT + ["run", "--env", "Pendulum-v1", "--pace", "lockstep", "--steps", "400",
                                 "--learning-starts", "200", "--hidden", "8", "--batch-size", "4", "--seq-len", "4",
                                 "--calib-updates", "2", "--run-dir", str(tmp_path / "run"), "--quiet"],
                       env={**os.environ, "SACLSTM_WEIGHTS_PATH": str(weights), "SACLSTM_UTD_RATIO": "1"},
                       capture_output=True, text=True, timeout=170)
    t1 = time.time()
    assert p.returncode == 0, p.stderr
    with open(tmp_path / "training_metrics.jsonl") as fh:
        lines = [json.loads(x) for x in fh]
    nine = {"epoch", "steps", "buffer_size", "drained", "grad_steps", "critic_loss", "actor_loss", "alpha_loss",
            "alpha"}
    assert lines and all(nine <= line.keys() for line in lines)
    assert all(t0 <= line["epoch"] <= t1 and isinstance(line["epoch"], float) for line in lines)
    assert all(line["grad_steps"] >= 1 for line in lines)  # no line for the 200 passes before learning
    steps = [line["steps"] for line in lines]
    assert steps == [sum(x["grad_steps"] for x in lines[:i + 1]) for i in range(len(lines))]
    assert len(lines) < 400 - 150 and steps[-1] > 100
    assert read_checkpoint(str(weights))["manifest"]["config"]["save_interval"] == 500
    # sacbot's own layout keeps its meanings: epoch counts passes, idle ones included.
    own = load_config(None, {}, {"weights_path": str(tmp_path / "w2")})
    assert (own.original_contract, own.save_interval) == (False, 5000)


@pytest.mark.timeout(180)
def test_a_run_that_starves_its_learner_says_so_and_sums_up_its_drops(tmp_path):
    """At --pace free a learner that cannot keep up drops transitions; the run warns once with the
    fix, its closing lines give the drops and the gradient steps per transition received, and the
    resolved settings are written to the run directory, loadable as a --config file."""
    p = subprocess.run(SACBOT + run_args(tmp_path, "--env", "Pendulum-v1", "--steps", "2000", "--hidden", "8",
                                         "--learning-starts", "50", "--utd-ratio", "64", "--queue-size", "4",
                                         "--seed", "3", "--pace", "free"),
                       capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr
    warned = [x for x in p.stderr.splitlines() if "the learner is not keeping up" in x]
    assert len(warned) == 1 and "--pace learner" in warned[0], p.stderr
    (summary,) = [x for x in p.stderr.splitlines() if x.startswith("sacbot: the learner got ")]
    got = int(summary.split("got ")[1].split(" ")[0])
    dropped = int(summary.split("dropped ")[1].split(" ")[0])
    assert got + dropped <= 2000 and got > 0 and dropped > 200, summary  # an episode whose start was lost sends none
    assert f"({dropped / 2000:.0%} of those played)" in summary and "(utd_ratio 64)" in summary
    cfg = load_config(str(tmp_path / "run" / "config.toml"), {}, {})
    assert (cfg.env, cfg.utd_ratio, cfg.queue_size, cfg.seed, cfg.steps) == ("Pendulum-v1", 64.0, 4, 3, 2000)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("learner", ["thread", "process"])
def test_the_default_pace_keeps_up_with_a_slow_learner_nothing_dropped_every_transition_trained(tmp_path, learner):
    """The learner pace (the default): a learner far slower than the game (UTD 6 into a queue of
    8) still gets every transition played, and does its UTD steps for all but the last half queue."""
    steps, utd, queue = 160, 6, 8
    p = subprocess.run(SACBOT + run_args(tmp_path, "--env", "Pendulum-v1", "--steps", str(steps), "--hidden", "8",
                                         "--batch-size", "2", "--seq-len", "4", "--learning-starts", "20",
                                         "--utd-ratio", str(utd), "--queue-size", str(queue), "--seed", "5",
                                         "--learner", learner),
                       capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr
    assert "the learner is not keeping up" not in p.stderr
    (summary,) = [x for x in p.stderr.splitlines() if x.startswith("sacbot: the learner got ")]
    got = int(summary.split("got ")[1].split(" ")[0])
    dropped = int(summary.split("dropped ")[1].split(" ")[0])
    assert (got, dropped) == (steps, 0), summary
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "training_metrics.jsonl")]
    grad_steps = sum(m["grad_steps"] for m in metrics)
    # Before learning starts nothing is owed; the close ends the last pass early (the rest stays
    # owed): at most half a queue more is untrained.
    assert grad_steps >= utd * (steps - 20 - queue // 2 - 1), (grad_steps, summary)


@pytest.mark.timeout(120)
def test_eval_and_run_play_the_env_their_bot_was_trained_on_and_eval_takes_a_checkpoint_file(tmp_path):
    w = tmp_path / "w"
    p = cli(tmp_path, "run", "--env", "Pendulum-v1", "--steps", "210", "--learning-starts", "100", "--hidden", "8",
            "--weights-path", str(w), "--run-dir", str(tmp_path / "run"), "--quiet")
    assert p.returncode == 0, p.stderr
    p = cli(tmp_path, "eval", "--weights-path", str(w), "--episodes", "1", "--run-dir", str(tmp_path / "e1"), "--json")
    assert p.returncode == 0, p.stderr
    assert "playing Pendulum-v1, the env the bot in" in p.stderr and "preset for sacbot/TankDuel" not in p.stderr
    assert json.loads(p.stdout)["episodes"] == 1
    p = cli(tmp_path, "eval", str(w / "sac_latest.zip"), "--episodes", "1", "--run-dir", str(tmp_path / "e2"), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["checkpoint"] == str(w / "sac_latest.zip"), p.stderr
    # A named env still wins, and is refused for a bot of another game, as before.
    p = cli(tmp_path, "eval", "--weights-path", str(w), "--env", "sacbot/CueMemory-v0", "--episodes", "1",
            "--run-dir", str(tmp_path / "e3"))
    assert p.returncode != 0 and "Pendulum-v1" in p.stderr
    for args, says in ((["eval", str(tmp_path / "missing.zip")], "is not accepted: expected an existing checkpoint"),
                       (["eval", str(w / "sac_latest.zip"), "--weights-path", str(w)], "not both")):
        p = cli(tmp_path, *args)
        assert p.returncode == 2 and says in p.stderr, p.stderr


@pytest.mark.timeout(180)
def test_a_resume_keeps_the_network_settings_the_bot_was_trained_with_unless_they_are_given(tmp_path):
    w, run = str(tmp_path / "w"), str(tmp_path / "run")
    p = cli(tmp_path, "run", "--env", "Pendulum-v1", "--steps", "120", "--learning-starts", "100", "--hidden", "8",
            "--weights-path", w, "--run-dir", run, "--quiet")
    assert p.returncode == 0, p.stderr
    # A TOML file or a flag that gives another value is refused, naming both; nothing changes.
    (tmp_path / "bot.toml").write_text("hidden = 16\n")
    for given, env in ((["--hidden", "16"], {}), (["--config", str(tmp_path / "bot.toml")], {}),
                       ([], {"SACBOT_HIDDEN": "16"})):
        p = cli(tmp_path, "run", "--steps", "240", "--weights-path", w, "--run-dir", run, "--quiet", *given, env=env)
        assert p.returncode == 2 and "hidden = 8, this run asks for hidden = 16" in p.stderr, p.stderr
    assert read_checkpoint(os.path.join(w, "sac_latest.zip"))["meta"]["env_steps"] == 120
    # Not given: the bot's own (a default or preset changed since would not refuse it either).
    p = cli(tmp_path, "run", "--steps", "240", "--weights-path", w, "--run-dir", run, "--quiet")
    assert p.returncode == 0, p.stderr
    assert "going on with the bot in" in p.stderr and "hidden=8 as it was trained" in p.stderr, p.stderr
    ckpt = read_checkpoint(os.path.join(w, "sac_latest.zip"))
    assert ckpt["meta"]["env_steps"] == 120 + 240 and ckpt["manifest"]["config"]["hidden"] == 8
    # Eval follows what decides how the bot plays: the memoryless control plays without a state.
    m = str(tmp_path / "m")
    p = cli(tmp_path, "run", "--env", "Pendulum-v1", "--steps", "120", "--learning-starts", "100", "--hidden", "8",
            "--memoryless", "--weights-path", m, "--run-dir", run, "--quiet")
    assert p.returncode == 0, p.stderr
    p = cli(tmp_path, "eval", "--weights-path", m, "--episodes", "1", "--run-dir", str(tmp_path / "e"), "--json")
    assert p.returncode == 0 and "memoryless=True as it was trained" in p.stderr, p.stderr
    assert "hidden=" not in p.stderr  # the export carries its own sizes: nothing else follows in eval
