"""``sacbot serve``'s flags and command: options checked up front (exit 2, nothing written), then
the server until SIGINT/SIGTERM, then every bot's final save (``sacbot run``'s exit codes)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import threading

from sacbot.config import Config, ConfigError, env_given, from_args, given_settings
from sacbot.serve import DEFAULT_PORT, MAX_FRAME

log = logging.getLogger("sacbot")

TOKEN_ENV = "SACBOT_SERVE_TOKEN"
MIN_REMOTE_TOKEN_CHARS = 16
# The env id a served bot is saved under when none is given: no preset applies (the defaults are
# meant for dense rewards), and a resume under another --env is refused as for any bot.
SERVE_ENV = "external"


def add_serve_arguments(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("serve")
    g.add_argument("--root", default="runs/serve",
                   help="directory of the server's status.json and of each bot, ROOT/<name>/{weights,run}")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1); any other than loopback needs --allow-remote "
                        "and a token")
    g.add_argument("--port", type=int, default=None,
                   help=f"TCP port (default {DEFAULT_PORT}; 0: any free port, logged and written to status.json); "
                        "with --socket and no --port, no TCP listener")
    g.add_argument("--socket", dest="socket_path", default=None, metavar="PATH",
                   help="also (or, without --port, only) listen on this Unix socket (mode 0600)")
    g.add_argument("--allow-remote", action="store_true",
                   help="allow a --host that is not a loopback address (every client must then send the token)")
    g.add_argument("--token", default=None,
                   help=f"a shared secret every client must send in hello (env {TOKEN_ENV}); required with "
                        f"--allow-remote, at least {MIN_REMOTE_TOKEN_CHARS} characters there")
    g.add_argument("--max-frame", type=int, default=MAX_FRAME,
                   help=f"largest frame accepted, in bytes (default {MAX_FRAME}: 1 MiB)")
    g.add_argument("--idle-timeout", type=float, default=60.0,
                   help="seconds a connection may send nothing before it is closed (default 60)")
    g.add_argument("--frame-timeout", type=float, default=10.0,
                   help="seconds from a frame's first byte to its last (default 10)")
    g.add_argument("--max-connections", type=int, default=64,
                   help="connections at once; more are answered with an error frame (default 64)")
    g.add_argument("--max-bots", type=int, default=32,
                   help="bots loaded at once, each with its own learner (default 32)")
    g.add_argument("--shared-learner", action="store_true",
                   help="one learner that every bot feeds (one policy, one replay, one checkpoint in "
                        "ROOT/_shared/weights; every bot must have the first bot's spaces), instead of one learner "
                        "per bot; for many instances of one game (with --learner process: in a process of its "
                        "own)")
    g.add_argument("--hold-ms", type=float, default=0.0,
                   help="the most a step's reply may be held while its bot's learner is over half a --queue-size of "
                        "transitions behind (default 0: never; a game's clock is its own). A game that waits for "
                        "its bot every turn (Robocode, a turn-based game) can give the learner time this way and "
                        "lose no transitions; keep it well below the game's reply timeout")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: where it resolves is not known here, so it is not taken as loopback
        return False


def _range(name: str, value, lo, hi) -> None:
    if not lo <= value <= hi:
        raise ConfigError(f"{name} = {value!r} is not accepted: expected a number in [{lo}, {hi}]")


def serve_options(args, env=None):
    """The server's own options, or ConfigError naming the flag, the value and what is accepted."""
    env = os.environ if env is None else env
    token = args.token if args.token is not None else (env.get(TOKEN_ENV) or None)
    if args.token is not None and not args.token:
        raise ConfigError("--token = '' is not accepted: expected a non-empty secret")
    remote = not is_loopback(args.host)
    if remote and not args.allow_remote:
        raise ConfigError(f"--host {args.host!r} is not a loopback address: any machine that reaches it could drive "
                          "and train these bots; pass --allow-remote and a token (--token or "
                          f"{TOKEN_ENV}) to listen there, or keep the default 127.0.0.1")
    if remote and (token is None or len(token) < MIN_REMOTE_TOKEN_CHARS):
        raise ConfigError(f"--host {args.host!r} with --allow-remote needs a token of at least "
                          f"{MIN_REMOTE_TOKEN_CHARS} characters (--token or {TOKEN_ENV}) that every client sends in "
                          f"its hello; got {'none' if token is None else f'{len(token)} characters'}")
    port = args.port
    if port is None and not args.socket_path:
        port = DEFAULT_PORT
    if port is not None:
        _range("--port", port, 0, 65535)
    if args.socket_path is not None and (not args.socket_path or len(os.fsencode(args.socket_path)) > 100):
        raise ConfigError(f"--socket = {args.socket_path!r} is not accepted: expected a path of 1 to 100 bytes "
                          "(the limit of a Unix socket's address)")
    _range("--max-frame", args.max_frame, 1024, 64 << 20)
    _range("--idle-timeout", args.idle_timeout, 0.1, 86400.0)
    _range("--frame-timeout", args.frame_timeout, 0.1, 3600.0)
    _range("--max-connections", args.max_connections, 1, 10_000)
    _range("--max-bots", args.max_bots, 1, 10_000)
    _range("--hold-ms", args.hold_ms, 0.0, 10_000.0)
    if args.hold_ms and args.shared_learner:
        raise ConfigError(f"--hold-ms = {args.hold_ms:g} is not accepted with --shared-learner: a game's steps are "
                          "never held for a learner that every game feeds; drop one of the two")
    if not args.root.strip():
        raise ConfigError(f"--root = {args.root!r} is not accepted: expected a directory path")
    from sacbot.serve.server import ServeOptions

    return ServeOptions(root=args.root, host=args.host, port=port, socket_path=args.socket_path, token=token,
                        max_frame=args.max_frame, idle_timeout=args.idle_timeout, frame_timeout=args.frame_timeout,
                        max_connections=args.max_connections, max_bots=args.max_bots,
                        shared_learner=args.shared_learner, hold_ms=args.hold_ms)


def serve_config(args, env=None) -> Config:
    """The bots' settings: ``sacbot run``'s, less those the game decides (ConfigError names them)."""
    env = os.environ if env is None else env
    if not env_given(args, env):
        args.env = SERVE_ENV
    cfg = from_args(args, env)
    if cfg.weights_path != Config.weights_path or cfg.run_dir != Config.run_dir:
        raise ConfigError("--weights-path and --run-dir are not accepted by sacbot serve: each bot lives under "
                          "--root, in ROOT/<name>/weights and ROOT/<name>/run; pass --root")
    for name in ("steps", "episodes", "episodes_per_opponent"):
        if getattr(cfg, name):
            raise ConfigError(f"{name} = {getattr(cfg, name)} is not accepted by sacbot serve: the games decide how "
                              "long they play; stop the server with SIGINT or SIGTERM")
    if cfg.pace == "realtime":
        raise ConfigError("pace = 'realtime' is not accepted by sacbot serve: each game keeps its own clock; use "
                          "learner (the default; a game's own loop is never paced), free or lockstep")
    if getattr(args, "shared_learner", False) and not cfg.eval_mode:
        if cfg.pace == "lockstep":
            raise ConfigError("pace = 'lockstep' is not accepted with --shared-learner: a bot cannot wait for "
                              "updates that every bot's experience shares; use learner (the default) or free")
    if cfg.tensorboard:
        raise ConfigError("tensorboard is not offered by sacbot serve yet; each bot's JSONL files are in "
                          "ROOT/<name>/run (sacbot plot reads them)")
    return cfg


def cmd_serve(args) -> int:
    from sacbot.console import Signals
    from sacbot.serve.server import ServeError, Server
    from sacbot.store.rundir import RunDirClaim, RunDirInUse

    # Each saved bot keeps the settings that shape its networks unless they are given.
    opts = dataclasses.replace(serve_options(args), given=given_settings(args, warn=False))
    cfg = serve_config(args)
    try:
        os.makedirs(opts.root, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--root {opts.root!r} cannot be used as a directory: {e.strerror or e}") from None
    claim = RunDirClaim(opts.root, opts.root)  # one server per root: both would write its status.json
    try:
        claim.acquire()
    except RunDirInUse as e:
        raise ConfigError(f"--root {opts.root!r} is in use by process {e.pid} (another sacbot serve, or a bot run "
                          "there); give each server its own --root") from None
    except OSError as e:
        raise ConfigError(f"--root {opts.root!r} cannot be written: {e.strerror or e}") from None
    try:
        stop = threading.Event()
        signals = Signals(stop, "stopping (eval saves nothing)" if cfg.eval_mode else "closing (every bot's final "
                                                                                        "save)")
        signals.install()
        server = Server(cfg, opts, stop)
        try:
            server.start()
        except ServeError as e:
            log.error(f"configuration error: {e}")
            return 2
        server.wait()
        return server.shutdown()
    finally:
        claim.release()
