"""``sacbot robocode``: headless Robocode battles against sample robots, the sacbot robot learning
(or, with --eval, playing its newest checkpoint deterministically).

``sacbot serve`` runs as a child process, not in this one: killing or losing it (the tests do) leaves
this command standing to read Robocode's results and say what happened, and the server keeps its own
signal handling, final save and exit codes unchanged.  Exit codes are ``sacbot run``'s: 0 ok, 2 bad
input (nothing started), 1 a failure (the server or Robocode did not finish as they should).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sacbot.console import Signals, die_with_parent
from sacbot.robocode import ACT_SIZE, GUNS, LEGACY_GUN, NEW_BOT_GUN, OBS_SIZE, OPPONENTS, REWARDS, ROBOT, ROBOT_ENTRY
from sacbot.robocode.install import (
    RobocodeMissing,
    find_install,
    java_command,
    prepare_workdir,
    sample_robots,
    write_battle,
)
from sacbot.robocode.results import ResultsError, describe_shooting, parse_results, read_stats, robot_row, shooting
from sacbot.store.atomic import atomic_write_text
from sacbot.store.pretrained import shipped_dir

log = logging.getLogger("sacbot")
SHIPPED = "robocode.zip"  # the Robocode bot shipped in the package (sacbot/bots/)
SHIPPED_ROBOT = "robocode.robot.json"  # its robot settings, as ROOT/<bot>/weights/robot.json holds a bot's
PROGRESS_S = 30.0  # seconds between a battle's progress lines

# The settings a new bot starts with unless flags after -- say otherwise: a process learner (a thread
# learner shares the server's GIL, and replies then overran a 5 ms wait at learning's start),
# TankDuel's learning settings (small rewards: a low initial temperature; n-step returns), and the
# replay kept when the opponent changes: each battle is against one opponent, and clearing the
# replay at every change left the learner a thousand fresh transitions to overfit (a bot that won
# 99% against sample.SittingDuck won 1 of 50 after five such battles against the others).
SERVE_DEFAULTS = ("--learner", "process", "--init-alpha", "0.02", "--n-step", "5", "--burn-in", "8",
                  "--opponent-policy", "keep")
OBS_SPACE = {"shape": [OBS_SIZE], "low": -1.0, "high": 1.0}
ACT_SPACE = {"shape": [ACT_SIZE], "low": -1.0, "high": 1.0}


class UsageError(Exception):
    pass


class Stopped(Exception):
    """A SIGINT or SIGTERM came: the battle in play was ended, and the server makes the bot's final save."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sacbot robocode",
        description="Headless Robocode battles of the sacbot robot (clients/robocode/) against sample robots, "
                    "one battle of --rounds rounds per opponent, the bot learning through sacbot serve (or "
                    "playing its newest checkpoint with --eval). Flags after -- go to sacbot serve (e.g. "
                    "-- --hidden 128 --seed 3). docs/robocode.md has the details.",
        epilog="exit codes: 0 ok, 2 bad input or Robocode missing (nothing started), 1 a failure")
    p.add_argument("--root", default="runs/robocode",
                   help="the bots (ROOT/<bot>/weights, ROOT/<bot>/run), Robocode's working directory "
                        "ROOT/_robocode and each battle's files (default runs/robocode)")
    p.add_argument("--bot", default="robocode", help="the bot's name (default robocode)")
    p.add_argument("--opponents", default=OPPONENTS[0],
                   help=f"comma-separated sample robots to fight, one battle each (default {OPPONENTS[0]}; "
                        f"e.g. {','.join(OPPONENTS)})")
    p.add_argument("--rounds", type=int, default=10, help="rounds per battle (default 10)")
    p.add_argument("--eval", action="store_true",
                   help="play the newest checkpoint deterministically; nothing under ROOT is written (Robocode's "
                        "files go to a temporary directory)")
    p.add_argument("--robocode", metavar="DIR", default=None,
                   help="a Robocode folder (robocode.jar or libs/robocode.jar, robots/sample); default: Debian's "
                        "package, found with dpkg -L robocode")
    p.add_argument("--java", default="java", help="the java to run Robocode with (default: java on PATH)")
    p.add_argument("--turn-budget-ms", type=float, default=100.0,
                   help="the time a robot's turn may take before Robocode skips it (robocode.cpu.constant; "
                        "default 100)")
    p.add_argument("--reply-ms", type=int, default=80,
                   help="how long the robot waits for an action before it drops the connection and stands still "
                        "for the rest of the round (default 80; less than --turn-budget-ms)")
    p.add_argument("--hold-ms", type=float, default=0.0,
                   help="the most the server holds a turn's reply while the learner is behind (sacbot serve "
                        "--hold-ms), so that the battle plays at the learner's pace and no turn's transition is "
                        "dropped; at most half of --reply-ms (default 0: the battle runs free and the learner "
                        "takes what it can, which learnt best in the runs in docs/experiments.md)")
    p.add_argument("--reward", choices=REWARDS, default=REWARDS[0],
                   help="the robot's reward: damage dealt minus taken and the round's outcome (default), or "
                        "'energy': also each bullet's power charged when fired and its hit bonus (3 x power) "
                        "when it hits, as Robocode moves energy; or 'dealt': the damage dealt and the outcome, "
                        "the damage taken not counted (docs/robocode.md)")
    p.add_argument("--gun", choices=GUNS, default=None,
                   help="how action 2 turns the gun: by up to 20 degrees from where it points ('turn'), or from "
                        "where the lead points ('lead': 0 follows the lead, the aim is given and the bot learns "
                        "the rest), or as 'lead' with a trigger that fires only while the gun points at the lead "
                        "within the enemy's half-width ('gated'). Fixed for a bot by its first training battle "
                        "(ROOT/<bot>/weights/robot.json); "
                        f"default: the bot's, '{NEW_BOT_GUN}' for a new bot, the shipped bot's own (sacbot/bots/"
                        "robocode.robot.json) for eval with no bot trained")
    p.add_argument("--battle-timeout", type=float, default=3600.0,
                   help="seconds a battle may take before Robocode is killed (default 3600)")
    p.add_argument("--port", type=int, default=0, help="the server's TCP port (default 0: a free one)")
    return p


def _opponents(spec: str, available: list[str]) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise UsageError("--opponents is empty: name at least one sample robot, e.g. sample.SittingDuck")
    for n in names:
        if n not in available:
            raise UsageError(f"--opponents: unknown robot {n!r}; expected sample robots of this Robocode, e.g. "
                             f"{', '.join(OPPONENTS)} (all: {', '.join(available)})")
    if len(set(names)) != len(names):
        raise UsageError(f"--opponents names a robot twice: {spec!r}")
    return names


def check(a) -> None:
    if not 1 <= a.rounds <= 100_000:
        raise UsageError(f"--rounds = {a.rounds} is not accepted: expected an integer in [1, 100000]")
    if not 1.0 <= a.turn_budget_ms <= 1000.0:
        raise UsageError(f"--turn-budget-ms = {a.turn_budget_ms} is not accepted: expected a number in [1, 1000]")
    if not 1 <= a.reply_ms < a.turn_budget_ms:
        raise UsageError(f"--reply-ms = {a.reply_ms} is not accepted: expected an integer from 1 to below "
                         f"--turn-budget-ms ({a.turn_budget_ms:g})")
    if not 0.0 <= a.hold_ms <= a.reply_ms / 2:
        raise UsageError(f"--hold-ms = {a.hold_ms:g} is not accepted: expected 0 to half of --reply-ms "
                         f"({a.reply_ms / 2:g}), so that a held reply still reaches the robot in time")
    if not 1.0 <= a.battle_timeout <= 7 * 86400:
        raise UsageError(f"--battle-timeout = {a.battle_timeout} is not accepted: expected seconds in [1, 604800]")
    if not 0 <= a.port <= 65535:
        raise UsageError(f"--port = {a.port} is not accepted: expected 0 to 65535")
    if not a.root.strip() or (os.path.exists(a.root) and not os.path.isdir(a.root)):
        raise UsageError(f"--root {a.root!r} is not accepted: expected a directory")
    ours = ("--root", "--port", "--eval", "--socket", "--host", "--hold-ms")
    bad = [f for f in a.serve_args if f.split("=")[0] in ours]
    if bad:
        raise UsageError(f"{bad[0].split('=')[0]} after -- is not accepted: sacbot robocode sets it (use its own "
                         "--root, --port, --hold-ms and --eval)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _eval_root(root: str, bot: str, tmp: str) -> str:
    """A server root for eval whose bot reads ROOT/<bot>/weights and writes nowhere under ROOT.  With no
    bot trained there, its weights folder is an empty one of its own, and the server plays the Robocode
    bot shipped in the package (sacbot/bots/robocode.zip), as ``sacbot eval`` plays a shipped bot."""
    weights = os.path.join(root, bot, "weights")
    sroot = os.path.join(tmp, "serve")
    os.makedirs(os.path.join(sroot, bot, "run"))
    if os.path.isdir(weights):
        os.symlink(os.path.abspath(weights), os.path.join(sroot, bot, "weights"))
    else:
        shipped = shipped_dir().joinpath(SHIPPED)
        if not shipped.is_file():
            raise UsageError(f"--eval: no bot trained in {weights} and no Robocode bot shipped with this sacbot; "
                             "train one first (sacbot robocode without --eval)")
        os.makedirs(os.path.join(sroot, bot, "weights"))
        with resources.as_file(shipped) as src:
            shutil.copyfile(src, os.path.join(sroot, bot, "weights", "sac_latest.zip"))
        log.info("robocode: no bot trained in %s; --eval plays the shipped Robocode bot, sacbot/bots/%s "
                 "(provenance in sacbot/bots/README.md)", weights, SHIPPED)
    return sroot


class Serve:
    """``sacbot serve`` as a child process, and the bot loaded in it before Robocode starts: the robot's
    own hello, at a round's start, must fit Robocode's start-up allowance."""

    def __init__(self, root: str, port: int, eval_mode: bool, hold_ms: float, extra: list[str], log_path: str):
        self.port = port
        cmd = [sys.executable, "-m", "sacbot", "serve", "--root", root, "--port", str(port), "--env", "robocode",
               "--quiet", *SERVE_DEFAULTS, *(["--eval"] if eval_mode else ["--hold-ms", f"{hold_ms:g}"]), *extra]
        self.log = open(log_path, "ab")
        # Its own session (a Ctrl-C reaches this command alone, which stops the server in order), and
        # SIGTERM at this command's death, even by kill -9: an orphaned server would hold the bot.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent(os.getpid()))

    def warm(self, bot: str) -> dict:
        from sacbot.serve.client import SacbotClient, ServerError

        c = SacbotClient(bot, OBS_SPACE, ACT_SPACE, port=self.port, timeout=30, hello_timeout=300, connect_for=120)
        try:
            welcome = c.connect()
        except ServerError as e:
            if e.code in ("spaces_mismatch", "bot_refused", "bot_unavailable"):
                raise UsageError(f"sacbot serve refused the bot: {e.code}: {e.message}") from None
            raise
        finally:
            c.close()
        return welcome

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 300.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # every bot's final save
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _bot_status(sroot: str, bot: str) -> dict:
    """The bot's totals so far from the server's status.json (written twice a second): what its learner
    took, dropped and trained, and how often a reply was held for it."""
    try:
        with open(os.path.join(sroot, "status.json"), encoding="utf-8") as f:
            st = json.load(f)["bots"][bot]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {k: st[k] for k in ("ticks", "env_steps_received", "drops", "learner_steps", "holds", "holds_out")
            if k in st}


def _watch(proc: subprocess.Popen, a, opponent: str, stats: str, t0: float, stop: threading.Event) -> int:
    """Robocode's exit code; a progress line every PROGRESS_S while the battle is played (rounds so far,
    from the robot's own lines); Robocode killed past --battle-timeout, or when ``stop`` is set."""
    shown = t0
    while True:
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        end: Exception | None = None
        if stop.is_set():
            end = Stopped(f"the battle against {opponent} was stopped after {now - t0:.0f} s; its rounds are not "
                          "counted")
        elif now - t0 > a.battle_timeout:
            end = RuntimeError(f"the battle against {opponent} took more than --battle-timeout "
                               f"{a.battle_timeout:g} s; Robocode was killed")
        if end is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise end
        if now - shown >= PROGRESS_S:
            shown = now
            played = read_stats(stats)
            log.info("robocode: vs %s: %d of %d rounds played, %d won, %d turns, %.0f s", opponent, len(played),
                     a.rounds, sum(1 for r in played if r.get("won")), sum(int(r.get("turns", 0)) for r in played),
                     now - t0)


def run_battle(a, inst, workdir: str, out_dir: str, opponent: str, port: int, stop: threading.Event) -> dict:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out_dir, f"{stamp}-{opponent}")
    battle, results, stats, log_path = base + ".battle", base + ".results.txt", base + ".rounds.jsonl", base + ".log"
    write_battle(battle, [ROBOT_ENTRY, opponent], a.rounds)
    # The robot's hello at a round's start has 300 turn budgets before Robocode gives up waiting.
    hello_ms = int(min(5000, 250 * a.turn_budget_ms))
    props = {"sacbot.port": str(port), "sacbot.bot": a.bot, "sacbot.opponent": opponent,
             "sacbot.replyMs": str(a.reply_ms), "sacbot.helloMs": str(hello_ms), "sacbot.stats": stats,
             "sacbot.reward": a.reward, "sacbot.gun": a.gun}
    # -tps 10000, Robocode's most: without a display Robocode does not hold turns back to a TPS anyway.
    cmd = java_command(inst, os.path.abspath(workdir), battle, results, 10000, props)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent(os.getpid()))
        code = _watch(proc, a, opponent, stats, t0, stop)
    seconds = time.monotonic() - t0
    if code != 0 or not os.path.isfile(results):
        raise RuntimeError(f"Robocode exited {code} against {opponent} without a results file; its output is in "
                           f"{log_path}")
    with open(results, encoding="utf-8") as f:
        rounds, rows = parse_results(f.read())
    me, them = robot_row(rows, ROBOT), robot_row(rows, opponent)
    played = read_stats(stats)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        # Robocode stops a robot for the round when it skips more than 30 turns in a row.
        disabled = f.read().count(f"{ROBOT_ENTRY} has skipped too many turns")
    total = (me.score + them.score) or 1
    return {"time": time.time(), "opponent": opponent, "mode": "eval" if a.eval else "train", "reward": a.reward,
            "gun": a.gun, "rounds": rounds,
            "wins": me.firsts, "win_rate": me.firsts / rounds, "score": me.score, "opponent_score": them.score,
            "score_share": me.score / total, "battle_s": round(seconds, 3),
            "turns": sum(int(r.get("turns", 0)) for r in played),
            "steps": sum(int(r.get("steps", 0)) for r in played),
            "skipped_turns": sum(int(r.get("skipped", 0)) for r in played),
            "reply_timeouts": sum(int(r.get("timeouts", 0)) for r in played),
            "rounds_unconnected": sum(1 for r in played if int(r.get("steps", 0)) == 0),
            "rounds_disabled": disabled,
            # Robocode stopped the robot's thread before the round's end reached it (docs/robocode.md).
            "rounds_finished_late": sum(1 for r in played if r.get("stopped")), **shooting(played),
            "results_file": results, "rounds_file": stats}


def _last_reward(root: str, bot: str) -> str | None:
    """The reward the bot's last training battle used (its robocode.jsonl; lines before the setting: damage)."""
    last = None
    try:
        with open(os.path.join(root, bot, "run", "robocode.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    last = json.loads(line).get("reward", REWARDS[0])
                except (ValueError, AttributeError):
                    continue
    except OSError:
        return None
    return last


def _robot_file(root: str, bot: str) -> str:
    return os.path.join(root, bot, "weights", "robot.json")  # beside the checkpoints: run/ holds logs


def _read_gun(path: Traversable, name: str) -> str:
    """The gun mapping a robot settings file records."""
    try:
        with path.open(encoding="utf-8") as f:
            recorded = json.load(f).get("gun")
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"{name} is not readable as the robot's settings ({e}); expected a JSON object such as "
                         '{"gun": "turn"}') from None
    if recorded not in GUNS:
        raise UsageError(f"{name}: gun = {recorded!r} is not accepted: expected one of {', '.join(GUNS)}")
    return recorded


def _trained_gun(a) -> tuple[str | None, str]:
    """The gun mapping bot ``a.bot`` was trained with and what says so, or (None, "") for a new bot."""
    path = _robot_file(a.root, a.bot)
    if os.path.isfile(path):
        return _read_gun(Path(path), path), path
    # A checkpoint with no robot.json (a bot from before the setting, or one copied in) turns the gun from
    # where it points, as does a shipped bot without its settings file.
    weights = os.path.dirname(path)
    if os.path.isdir(weights) and any(n.endswith(".zip") for n in os.listdir(weights)):
        return LEGACY_GUN, "its checkpoint has no robot.json: a bot from before --gun"
    if not a.eval:
        return None, ""
    shipped = shipped_dir().joinpath(SHIPPED_ROBOT)
    if shipped.is_file():
        return _read_gun(shipped, f"sacbot/bots/{SHIPPED_ROBOT}"), "the shipped bot"
    return LEGACY_GUN, "the shipped bot"


def _resolve_gun(a) -> bool:
    """Sets ``a.gun`` to the gun mapping the bot was trained with, which no flag may change: a bot that learnt
    to turn the gun from the lead aims wrong with turns from where the gun points, and the other way round.
    True for a new bot, whose mapping is then to be recorded."""
    recorded, whose = _trained_gun(a)
    if recorded is not None and a.gun not in (None, recorded):
        raise UsageError(f"--gun {a.gun} is not accepted for bot {a.bot}: it was trained with --gun {recorded} "
                         f"({whose}), and a bot keeps its gun mapping; train a new bot with --bot NAME")
    a.gun = recorded or a.gun or NEW_BOT_GUN
    return recorded is None


def _record_gun(a) -> None:
    """A new bot's gun mapping, written before its first battle (a checkpoint may come before the first line of
    robocode.jsonl)."""
    path = _robot_file(a.root, a.bot)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps({"gun": a.gun}) + "\n")


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    a = parser().parse_args(argv)
    a.serve_args = extra
    tmp = None
    try:
        check(a)
        new_bot = _resolve_gun(a)
        inst = find_install(a.robocode, a.java)
        opponents = _opponents(a.opponents, sample_robots(inst))
        if a.eval:
            tmp = tempfile.mkdtemp(prefix="sacbot-robocode-eval-")
            sroot, workdir, out_dir = _eval_root(a.root, a.bot, tmp), os.path.join(tmp, "robocode"), tmp
        else:
            sroot, workdir = a.root, os.path.join(a.root, "_robocode")  # "_": never a bot's name
            out_dir = os.path.join(workdir, "battles")
            os.makedirs(out_dir, exist_ok=True)
        prepare_workdir(inst, workdir, a.turn_budget_ms)
        if new_bot:
            _record_gun(a)
        before = None if a.eval else _last_reward(a.root, a.bot)
        if before not in (None, a.reward):
            log.warning("robocode: bot %s trained with --reward %s until now and goes on with --reward %s: its "
                        "replay holds both until the new rewards fill it", a.bot, before, a.reward)
    except (UsageError, RobocodeMissing) as e:
        log.error("robocode: %s", e)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        return 2
    except (RuntimeError, OSError) as e:
        log.error("robocode: %s", e)
        return 1
    port = a.port or _free_port()
    # The first SIGINT/SIGTERM ends the battle in play and stops the server (every bot's final save); a
    # second exits at once, and the children get SIGTERM from the kernel (die_with_parent).
    stop = threading.Event()
    Signals(stop, "stopping the battle; the server makes the bot's final save").install()
    serve = Serve(sroot, port, a.eval, a.hold_ms, a.serve_args, os.path.join(out_dir, "serve.log"))
    code, summaries = 0, []
    try:
        try:
            welcome = serve.warm(a.bot)
        except UsageError as e:
            log.error("robocode: %s", e)
            return 2
        print(f"sacbot robocode: bot {a.bot} ({welcome['mode']}), "
              f"{'resumed from ' + welcome['resumed_from'] if welcome.get('resumed_from') else 'started fresh'}, "
              f"{welcome['episodes']} episodes so far; server on port {port}", flush=True)
        for opponent in opponents:
            if stop.is_set():
                raise Stopped(f"stopped before the battle against {opponent}")
            s = run_battle(a, inst, workdir, out_dir, opponent, port, stop)
            summaries.append(s)
            print(f"sacbot robocode: vs {opponent}: won {s['wins']}/{s['rounds']} ({s['win_rate']:.0%}), score share "
                  f"{s['score_share']:.0%}, {s['turns']} turns in {s['battle_s']:.1f} s, skipped turns "
                  f"{s['skipped_turns']}, reply timeouts {s['reply_timeouts']}, {describe_shooting(s)}"
                  + (f", rounds the robot was stopped for skipping turns {s['rounds_disabled']}"
                     if s["rounds_disabled"] else "")
                  + (f", rounds whose end the robot did not see (ended as lost at the next round's start) "
                     f"{s['rounds_finished_late']}" if s["rounds_finished_late"] else ""), flush=True)
            s["server"] = _bot_status(sroot, a.bot)
            if not a.eval:
                with open(os.path.join(a.root, a.bot, "run", "robocode.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps(s) + "\n")
            if not serve.alive():
                raise RuntimeError(f"sacbot serve exited ({serve.proc.returncode}) during the battle against "
                                   f"{opponent}; the robot stood still once it lost the server, and the next run "
                                   f"resumes from the newest checkpoint")
    except Stopped as e:
        log.info("robocode: %s", e)  # a stop asked for: exit 0 once the server's final save is made, as sacbot run
    except (RuntimeError, ResultsError, OSError, ConnectionError) as e:
        log.error("robocode: %s", e)
        code = 1
    finally:
        served = serve.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if code == 0 and served != 0:
        log.error("robocode: sacbot serve exited %s (its log: %s)", served, os.path.join(out_dir, "serve.log"))
        code = 1
    if summaries:
        print(json.dumps({"bot": a.bot, "mode": "eval" if a.eval else "train",
                          "win_rates": {s["opponent"]: s["win_rate"] for s in summaries},
                          "battles": [{k: s[k] for k in ("opponent", "gun", "rounds", "wins", "score_share", "shots",
                                                         "hits", "hit_rate", "aim_error_deg")}
                                      for s in summaries]}))
    return code
