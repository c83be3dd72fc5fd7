"""Command line: ``sacbot run | eval | inspect | status`` (also ``python -m sacbot``).

Exit codes: 0 success, 1 failure (learner crashed, invalid checkpoint), 2 bad usage
or configuration, 3 the final checkpoint could not be written (read-only or full disk),
128 + N a second signal N (130 for SIGINT).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading

from sacbot import __version__
from sacbot.config import Config, ConfigError, add_arguments, env_given, from_args, given_settings
from sacbot.console import Signals, setup_logging

log = logging.getLogger("sacbot")
EXIT_SAVE_FAILED = 3  # the run ended, but its final checkpoint could not be written


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sacbot", description="Bots that learn while they play.")
    p.add_argument("--version", action="version", version=f"sacbot {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, help_ in (("run", "play and learn; resumes from the weights path"),
                        ("eval", "evaluate the newest checkpoint (eval mode: nothing is saved)")):
        desc = help_ if name == "run" else (help_ + "; with no --episodes, --steps or --episodes-per-opponent "
                                            "(or all 0) it plays 10 episodes, so an eval always ends")
        sp = sub.add_parser(name, help=help_, description=desc)
        sp.add_argument("--config", metavar="TOML", help="TOML config file (env SACBOT_CONFIG)")
        add_arguments(sp)
        if name == "eval":
            sp.add_argument("--json", action="store_true", help="print the summary as one JSON object")
            sp.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                            help="a checkpoint file to play (instead of --weights-path's newest); its env is "
                                 "played unless --env says otherwise")
    sp = sub.add_parser("cluster", help="N bots on Ray feeding one learner (needs the ray extra)",
                        description="N bots on Ray feeding one learner: a local Ray instance of its own, "
                                    "or a running cluster with --address. Needs: pip install 'sacbot[ray]'.")
    sp.add_argument("--config", metavar="TOML", help="TOML config file (env SACBOT_CONFIG)")
    g = sp.add_argument_group("cluster")
    g.add_argument("--bots", type=int, default=2, help="bot actors to run (default 2)")
    g.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto, or HOST:PORT) instead of "
                                                   "starting a local one")
    g.add_argument("--root", default="runs/cluster", help="directory of the cluster's status and the bots' files")
    g.add_argument("--learner-cpus", type=float, default=1.0, help="CPUs reserved for the learner actor")
    g.add_argument("--learner-gpus", type=float, default=0.0, help="GPUs for the learner (with --device cuda)")
    g.add_argument("--bot-cpus", type=float, default=1.0, help="CPUs reserved for each bot actor")
    g.add_argument("--freeze-timeout", type=float, default=0.0,
                   help="restart a bot whose round counter has not moved for this many seconds (0: off)")
    add_arguments(sp)
    sp = sub.add_parser("serve", help="games in any language connect over a local socket and get an action "
                                      "per tick (docs/protocol.md)",
                        description="Serve bots to games over TCP (127.0.0.1) or a Unix socket: each connection "
                                    "plays one bot, named in its hello, kept in ROOT/<name>/. The protocol is in "
                                    "docs/protocol.md.")
    sp.add_argument("--config", metavar="TOML", help="TOML config file (env SACBOT_CONFIG)")
    from sacbot.serve.command import add_serve_arguments

    add_serve_arguments(sp)
    add_arguments(sp)
    sp = sub.add_parser("inspect", help="verify a checkpoint and summarise its manifest")
    sp.add_argument("file")
    sub.add_parser("runner", help="launch N bots and restart frozen ones (sacbot runner --help)", add_help=False)
    sub.add_parser("robocode", help="Robocode battles, the bot learning (sacbot robocode --help)", add_help=False)
    sp = sub.add_parser("plot", help="one overview image of a run, or of several overlaid (needs the plot extra)",
                        description="Draw a run's return and win rate per opponent against env steps, each loss "
                                    "and alpha on its own axis, gradient steps/s, drops, act() latency and evals, "
                                    "into one PNG. Several run directories are overlaid, one colour each.")
    sp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (--run-dir of sacbot run)")
    sp.add_argument("--out", metavar="FILE", help="the PNG to write (default RUN_DIR/plots/overview.png; "
                                                  "needed for several runs)")
    sp = sub.add_parser("export", help="the actor as ONNX, safetensors and JSON, for a game that loads it itself "
                                       "(needs the export extra)",
                        description="Write CHECKPOINT's actor into OUT_DIR: actor.onnx (sacbot's policy exactly, "
                                    "the recurrent state as inputs and outputs), actor_int8.onnx (int8 weights "
                                    "through QuantizeLinear and MatMulInteger), actor.safetensors and actor.json "
                                    "(spaces, sizes, action scaling). docs/export.md shows a game loading them.")
    sp.add_argument("checkpoint", metavar="CHECKPOINT", help="the checkpoint zip, e.g. weights/sac_latest.zip")
    sp.add_argument("out_dir", metavar="OUT_DIR", help="the directory to write (made if missing)")
    sp.add_argument("--zip", action="store_true", help="also OUT_DIR/bot.zip: the checkpoint without its replay "
                                                       "buffer, a small file that evaluates and trains on")
    sp.add_argument("--force", action="store_true", help="replace the files an earlier export wrote in OUT_DIR")
    sp = sub.add_parser("render", help="a GIF of one episode played by a checkpoint (needs the plot extra)",
                        description="Play one episode with a checkpoint's deployed actor, deterministically, in "
                                    "the env it trained in (or --env), and write its frames as a GIF. The env "
                                    "must render rgb_array frames.")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT", help="the checkpoint zip whose actor plays")
    src.add_argument("--random", action="store_true", help="a uniformly random policy plays --env instead")
    sp.add_argument("--env", help="the env to play (default: the checkpoint's own)")
    sp.add_argument("--env-kwargs", default="", metavar="JSON", help="laid over the env's kwargs, e.g. "
                                                                      '\'{"opponents": ["spinner"]}\'')
    sp.add_argument("--seed", type=int, default=0, help="the episode's seed (default 0)")
    sp.add_argument("--max-ticks", type=int, default=1000, help="stop after this many ticks (default 1000)")
    sp.add_argument("--every", type=int, default=2, help="keep every Nth frame (default 2: a smaller GIF)")
    sp.add_argument("--out", default="episode.gif", help="the GIF to write (default episode.gif)")
    sp = sub.add_parser("status", help="print a run directory's heartbeat")
    sp.add_argument("run_dir", nargs="?", default="runs/default")
    return p


def cmd_run(args, eval_mode: bool) -> int:
    if eval_mode and getattr(args, "eval_mode", None) is False:
        raise ConfigError("--no-eval is not accepted by sacbot eval, which always runs in eval mode; "
                          "use sacbot run to train")
    if eval_mode:  # before the Config is built: its checks differ in eval (a best.zip may be read, not trained)
        args.eval_mode = True
    if getattr(args, "checkpoint", None):  # sacbot eval PATH
        if args.weights_path is not None:
            raise ConfigError("give the bot to evaluate as CHECKPOINT or as --weights-path, not both")
        if not os.path.isfile(args.checkpoint) or not args.checkpoint.lower().endswith(".zip"):
            raise ConfigError(f"CHECKPOINT {args.checkpoint!r} is not accepted: expected an existing checkpoint file "
                              "(a .zip, as sacbot run writes; a directory goes to --weights-path)")
        args.weights_path = args.checkpoint
    cfg = _resume_config(args)
    if cfg.eval_mode:
        if getattr(args, "json", False):
            cfg = dataclasses.replace(cfg, quiet=True)
        if not cfg.episodes and not cfg.steps and not cfg.episodes_per_opponent:
            cfg = dataclasses.replace(cfg, episodes=10)
    from sacbot.app.envcheck import check_env

    check_env(cfg)  # a bad env kwarg is a config error before anything is written
    from sacbot.app.tensorboard import start_sink

    sink = start_sink(cfg)  # None without --tensorboard; without the extra a config error (exit 2)
    # Imported after the checks: torch takes seconds to import, a bad setting should not wait.
    from sacbot.acting.agent import AgentError, AgentInterrupted
    from sacbot.acting.latency import summary
    from sacbot.app.driver import drive
    from sacbot.wire.messages import MessageError

    stop = threading.Event()
    signals = Signals(stop, "stopping (eval saves nothing)" if cfg.eval_mode else "closing (final save)")
    signals.install()
    try:
        report = drive(cfg, stop)
    except AgentInterrupted as e:  # the signal came while the bot was starting
        log.error("%s", e)
        return 128 + (signals.signum or signal.SIGINT)
    except AgentError as e:
        log.error("%s", e)
        return 1
    except MessageError as e:  # the env gave a value the bot refuses (NaN) after the start-up check passed
        log.error(f"the env {cfg.env} gave a value sacbot cannot learn from: {e}; the bot was closed and its "
                  "last checkpoint kept")
        return 1
    finally:
        if sink is not None and not sink.stop(timeout=10):  # after drive: the final lines are written
            log.warning("the TensorBoard sink did not finish in 10 s; its last scalars may be missing "
                        "(the JSONL files are complete)")
    agent = report.pop("agent")
    if cfg.eval_mode:
        s = summary(agent)
        if getattr(args, "json", False):
            print(json.dumps(s))
        elif not s["episodes"] and signals.signum:
            print(f"eval: interrupted before any episode finished ({report['env_steps']} env steps)")
        elif not s["episodes"]:
            print(f"eval: no episode finished in {report['env_steps']} env steps (checkpoint "
                  f"{s['checkpoint']}); give it more --steps, or use --episodes")
        else:
            print(f"eval: {s['episodes']} episodes, return {s['mean_return']:.2f} ± {s['std_return']:.2f} "
                  f"(checkpoint {s['checkpoint']})")
            for opp, r in s["per_opponent"].items():
                won = f", won {r['win_rate']:.0%}" if "win_rate" in r else ""
                print(f"  {opp or '-'}: {r['episodes']} episodes, return {r['mean_return']:.2f} "
                      f"± {r['std_return']:.2f}{won}")
        if not s["episodes"]:  # an eval that saw no episode end measured nothing
            return 128 + signals.signum if signals.signum else 1
        return 0
    err = agent.learner_error
    final = report.get("final_save") or {}
    last = report.get("last_save") if final.get("ok") else None
    if report.get("mean_return_last20") is not None:
        won = report.get("win_rate_last20")
        log.info(f"last {min(agent.episodes, 20)} episodes: mean return {report['mean_return_last20']:.2f}"
                 + (f", won {won:.0%}" if won is not None else ""))
    log.info(f"{report['env_steps']} env steps, {report.get('learner_steps', 0)} gradient steps, "
             f"{agent.episodes} episodes; final checkpoint: {last['path'] if last else 'none'}")
    drops = (report.get("drops") or {}).get("transition", 0)
    received = report.get("env_steps_received") or 0
    utd = report.get("learner_steps", 0) / received if received else 0.0
    log.info(f"the learner got {received} transitions and dropped {drops} "
             f"({drops / max(report['env_steps'], 1):.0%} of those played); gradient steps per transition "
             f"received {utd:.2f} (utd_ratio {cfg.utd_ratio:g})")
    if err:
        log.error(f"the learner failed: {err}")
        return 1
    if not final.get("ok"):
        # The runner (and any script) must not take lost work for a finished run.
        if final.get("timed_out"):
            log.error(f"{final.get('error')}: the bot did not wait longer (--final-save-timeout "
                      f"{final.get('deadline_s', cfg.final_save_timeout):g}); the newest checkpoint in "
                      f"{cfg.weights_path!r} may be older than this run's work")
        else:
            log.error(f"the final checkpoint was NOT written ({final.get('error', 'unknown')}); "
                      f"the newest checkpoint in {cfg.weights_path!r} is older than this run's work")
        return EXIT_SAVE_FAILED
    return 0


def _resume_config(args) -> Config:
    """The run's settings, going on from the bot in its weights path if there is one: with no env
    named, the bot's env (and env kwargs), so a Pendulum bot is resumed or evaluated on Pendulum
    without --env; and the settings that shape its networks that the user did not give, as it was
    trained (``follow_saved``), so a default or preset changed since does not refuse it.  A bot that
    cannot be read here is left to the start, which says what is wrong with it."""
    from sacbot.store.load import saved_config

    logger = logging.getLogger("sacbot")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the pass that finds the weights path: its lines are said once, below
    try:
        first = from_args(args)
        given = given_settings(args, warn=False)
    except ConfigError:
        first = None
    finally:
        logger.setLevel(level)
    if first is None:
        return from_args(args)  # raises the same error, after saying the warnings that came before it
    found = saved_config(first.weights_dir, first.latest_name)
    saved = found[0] if found is not None else {}
    if not env_given(args) and isinstance(saved.get("env"), str) and saved["env"] != first.env:
        args.env = saved["env"]
        if args.env_kwargs is None and isinstance(saved.get("env_kwargs"), str):
            args.env_kwargs = saved["env_kwargs"]
        log.info("playing %s, the env the bot in %s was trained on (--env chooses another)", args.env,
                 first.weights_path)
    cfg = from_args(args)
    return _follow_saved_bot(cfg, given, found) if found is not None else cfg


def _follow_saved_bot(cfg: Config, given: frozenset[str], found: tuple[dict, str] | None = None) -> Config:
    """``cfg`` with the settings that shape the saved bot's networks, as it was trained, where the
    user gave none (said in the log)."""
    from sacbot.store.load import follow_saved_bot

    cfg, said, path = follow_saved_bot(cfg, given, found)
    if said:
        log.info("going on with the bot in %s: %s", path, said)
    return cfg


def cmd_inspect(args) -> int:
    from sacbot.store.compat import ABSENT_MEANS, RESUME_FIELDS
    from sacbot.store.errors import CheckpointError, CheckpointStop
    from sacbot.store.read import read_checkpoint

    try:
        ck = read_checkpoint(args.file)  # every entry, the training state included: what a resume refuses
    except CheckpointStop as e:  # not proven bad: a newer format, or the system would not let us read it
        print(f"cannot verify: {e}")
        return 1
    except CheckpointError as e:
        print(f"invalid: {e}")
        return 1
    m = ck["manifest"]
    print(f"{args.file}: valid sacbot checkpoint")
    print(f"  format_version {m.get('format_version')}"
          + (f" (migrated from {m['migrated_from']})" if m.get("migrated_from") else ""))
    print(f"  sacbot {m.get('sacbot_version')}, step {m.get('step')}, env steps {m.get('env_steps')}")
    for n, e in sorted(m.get("entries", {}).items()):
        print(f"  {n:24s} {e['size']:>12,d} bytes  sha256 {e['sha256'][:16]}…  verified")
    # The read was bounded: say by how much, and where the bound came from.
    raw = sum(e.get("raw_size", e["size"]) for e in m.get("entries", {}).values())
    cap = ck["byte_cap"]
    print(f"  byte cap {cap.bytes:,d} ({cap.why}); the entries hold {raw:,d} decompressed bytes")
    cfg = m.get("config", {})
    # The settings that shape its networks (what a resume compares), then how it was trained.
    keys = ("env", *RESUME_FIELDS, "batch_size", "seq_len", "utd_ratio", "buffer_size", "gamma", "n_step")
    # A file from before a setting existed was trained as ABSENT_MEANS says: show that, since a
    # refused resume sends the user here for the bot's settings.
    if cfg:
        cfg = {**{k: f"{v} (saved before the setting)" for k, v in ABSENT_MEANS.items()}, **cfg}
    print("  config: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg))
    # The game: a resume or eval under other env kwargs that change what its values mean is refused.
    layout = m.get("spaces", {}).get("env_layout")
    layout = f"; its layout: {', '.join(f'{k}={v!r}' for k, v in layout.items())}" if isinstance(layout, dict) else ""
    if cfg.get("env_kwargs") or layout:
        print(f"  env_kwargs: {cfg.get('env_kwargs') or '(none)'}{layout}")
    return 0


def cmd_cluster(args) -> int:
    from sacbot.app.cluster import ClusterArgs, run_cluster

    # The learner goes on with the bot in --weights-path: its network settings follow it unless given.
    cfg = _follow_saved_bot(from_args(args), given_settings(args, warn=False))
    a = ClusterArgs(bots=args.bots, address=args.address, root=args.root, learner_cpus=args.learner_cpus,
                    learner_gpus=args.learner_gpus, bot_cpus=args.bot_cpus, freeze_timeout=args.freeze_timeout)
    stop = threading.Event()
    Signals(stop).install()
    return run_cluster(cfg, a, stop)


def _tool(name: str, run, error: type[Exception], extra: str | None = None) -> int:
    """A tool subcommand: its line on stdout, exit 0; a bad argument (ValueError) or, with an
    ``extra``, that extra missing: exit 2; its own ``error``: exit 1; each one line on stderr."""
    try:
        print(run())
    except ValueError as e:
        log.error(f"{name}: {e}")
        return 2
    except ImportError as e:
        if extra is None:
            raise
        log.error(f"{name}: {e.name or e} is not installed; install the {extra} extra: pip install 'sacbot[{extra}]'")
        return 2
    except error as e:
        log.error(f"{name}: {e}")
        return 1
    return 0


def cmd_plot(args) -> int:
    from sacbot.app.plot import PlotError, plot

    return _tool("plot", lambda: plot(args.run_dirs, args.out), PlotError)


def cmd_export(args) -> int:
    from sacbot.app.export import ExportArgs, ExportError, export

    return _tool("export", lambda: export(ExportArgs(args.checkpoint, args.out_dir, force=args.force, zip=args.zip)),
                 ExportError, extra="export")


def cmd_render(args) -> int:
    from sacbot.app.render import RenderArgs, RenderError, render

    a = RenderArgs(checkpoint=None if args.random else args.checkpoint, out=args.out, env=args.env,
                   env_kwargs=args.env_kwargs, seed=args.seed, max_ticks=args.max_ticks, every=args.every)
    return _tool("render", lambda: render(a), RenderError, extra="plot")


def cmd_status(args) -> int:
    from sacbot.app.status import print_status

    return print_status(args.run_dir)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["runner"]:  # its own parser: everything after -- goes to the bots
        from sacbot.app.runner import main as runner_main
        return runner_main(argv[1:])
    if argv[:1] == ["robocode"]:  # its own parser, as the runner's: everything after -- goes to sacbot serve
        from sacbot.robocode.command import main as robocode_main
        return robocode_main(argv[1:])
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # SIGINT before cmd_run installs its handler (imports, config, env check): no agent
        # exists yet, so nothing needs a save; one line instead of a traceback.
        log.warning("interrupted during start-up; nothing was saved")
        return 128 + signal.SIGINT


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd in ("run", "eval"):
            return cmd_run(args, args.cmd == "eval")
        if args.cmd == "cluster":
            return cmd_cluster(args)
        if args.cmd == "serve":
            from sacbot.serve.command import cmd_serve

            return cmd_serve(args)
        if args.cmd == "inspect":
            return cmd_inspect(args)
        if args.cmd == "plot":
            return cmd_plot(args)
        if args.cmd == "render":
            return cmd_render(args)
        if args.cmd == "export":
            return cmd_export(args)
        return cmd_status(args)
    except ConfigError as e:
        log.error(f"configuration error: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
