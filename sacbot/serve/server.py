"""``sacbot serve``: games in any language connect over a local socket and get an action per tick.

    server = Server(cfg, ServeOptions(root="runs/serve", port=0), stop)
    server.start()                 # binds; ServeError if it cannot (port in use, a file in the way)
    server.port                    # the TCP port bound (with port 0: the one the system chose)
    server.wait()                  # until ``stop`` is set
    code = server.shutdown()       # every bot's final save; sacbot run's exit codes

Threads, all named: ``sacbot-serve-loop`` serves every connection from one selector, and runs the
steps itself; what may take long runs on ``sacbot-serve-conn-<n>`` threads (:mod:`sacbot.serve.loop`
says which); ``sacbot-serve-status`` writes ``ROOT/status.json`` once a second.  The wire protocol
is in :mod:`sacbot.serve.protocol` and docs/protocol.md.  Nothing here imports torch: the bots'
learners are built by the same assembly an Agent uses (``--learner thread`` or ``process``).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass

from sacbot import __version__
from sacbot.config import Config
from sacbot.serve import DEFAULT_PORT, MAX_FRAME
from sacbot.serve import protocol as p
from sacbot.serve.bots import BotRegistry
from sacbot.serve.loop import STOP_GRACE_S, Loop
from sacbot.store.liveness import Heartbeat

log = logging.getLogger("sacbot")
EXIT_SAVE_FAILED = 3  # as sacbot run: a final checkpoint was not written, or not confirmed


class ServeError(RuntimeError):
    """The server cannot start (port in use, a file where the socket goes): the message says why."""


@dataclass(frozen=True)
class ServeOptions:
    root: str = "runs/serve"
    host: str = "127.0.0.1"
    port: int | None = DEFAULT_PORT  # None: no TCP listener (a Unix socket only); 0: any free port
    socket_path: str | None = None
    token: str | None = None
    max_frame: int = MAX_FRAME
    idle_timeout: float = 60.0
    frame_timeout: float = 10.0
    max_connections: int = 64
    max_bots: int = 32
    shared_learner: bool = False  # one learner every bot feeds (sacbot/serve/shared.py)
    hold_ms: float = 0.0  # the most a step's reply waits for a learner that is behind (0: never)
    # The settings the user gave; the other settings that shape a bot's networks follow each saved
    # bot, as it was trained (None: none follow, a saved bot of other settings is refused).
    given: frozenset[str] | None = None


class Server:
    def __init__(self, cfg: Config, opts: ServeOptions, stop: threading.Event):
        self.cfg, self.opts, self.stop = cfg, opts, stop
        self.shared = None
        if opts.shared_learner:
            from sacbot.serve.bots import follow_saved_bot
            from sacbot.serve.shared import SharedLearner, shared_weights

            # Every bot plays the shared learner's networks: the server's settings follow its bot.
            followed = follow_saved_bot(dataclasses.replace(cfg, weights_path=shared_weights(opts.root)),
                                        opts.given, lambda m: log.info("serve: the shared bot: %s", m))
            self.cfg = cfg = dataclasses.replace(followed, weights_path=cfg.weights_path)
            self.shared = SharedLearner(cfg, opts.root, stop)
        self.registry = BotRegistry(cfg, opts.root, stop, opts.max_bots, shared=self.shared, given=opts.given)
        self.port: int | None = None
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.loop: Loop | None = None
        # Where a step may wait for the learner, each connection's messages run on a thread of its own
        # (the Agent serves one thread); elsewhere the loop itself runs them: a step is a fast numpy act().
        self.threaded = not cfg.eval_mode and (cfg.pace == "lockstep" or (opts.hold_ms > 0 and cfg.pace == "learner"))
        self.started = time.time()
        self.stopped: float | None = None  # when shutdown() ended: the last status says so
        self.heartbeat = Heartbeat(os.path.join(opts.root, "status.json"))

    # --- listening ----------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.opts.root, exist_ok=True)
        where = ""
        try:
            if self.opts.port is not None:
                where = f"{self.opts.host}:{self.opts.port}"
                family = socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET
                s = socket.create_server((self.opts.host, self.opts.port), family=family, backlog=256)
                self._listeners.append(s)
                self.port = s.getsockname()[1]
            if self.opts.socket_path:
                where = f"--socket {self.opts.socket_path}"
                self._listeners.append(self._bind_unix(self.opts.socket_path))
        except BaseException as e:
            for s in self._listeners:
                s.close()
            if not isinstance(e, OSError):
                raise
            raise ServeError(f"cannot listen on {where}: {e.strerror or e}"
                             + ("; is another server using it? pass another --port (0: any free one)"
                                if e.errno == errno.EADDRINUSE else "")) from None
        for s in self._listeners:
            s.setblocking(False)
        self.loop = Loop(self, self._listeners)
        self._write_status()
        for name, target in (("sacbot-serve-loop", self.loop.run), ("sacbot-serve-status", self._status_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        where = ", ".join(self.addresses())
        log.info("serve: listening on %s (protocol %d%s, root %s)", where, p.PROTOCOL_VERSION,
                 ", eval mode" if self.cfg.eval_mode else "", self.opts.root)

    def _bind_unix(self, path: str) -> socket.socket:
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ServeError(f"--socket {path!r}: a file that is not a socket is in the way; pass another path")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(path)
                raise ServeError(f"--socket {path!r} is in use by a running server; stop it or pass another path")
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(path)  # a killed server's socket file: nobody listens there
            finally:
                probe.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(path)
            os.chmod(path, 0o600)  # the file's permissions are the socket's access control: this user only
            s.listen(256)
        except OSError:
            s.close()
            raise
        return s

    def addresses(self) -> list[str]:
        out = []
        if self.port is not None:
            out.append(f"tcp {self.opts.host}:{self.port}")
        if self.opts.socket_path:
            out.append(f"unix {self.opts.socket_path}")
        return out

    # --- status ---------------------------------------------------------------------------
    def status(self) -> dict:
        bots = {b.name: b.summary() for b in self.registry.bots()}
        n, refused = (len(self.loop.links), self.loop.refused) if self.loop is not None else (0, 0)
        return {"kind": "serve", "pid": os.getpid(), "time": time.time(), "started": self.started,
                "mode": "eval" if self.cfg.eval_mode else "train", "protocol": p.PROTOCOL_VERSION,
                "sacbot_version": __version__, "listen": self.addresses(), "port": self.port,
                "socket": self.opts.socket_path, "connections": n, "refused_connections": refused,
                "ticks": sum(b.get("ticks") or 0 for b in bots.values()),
                "episodes": sum(b.get("episodes") or 0 for b in bots.values()),
                "learner_failures": self.registry.learner_failures, "stopped": self.stopped, "bots": bots,
                "shared_learner": self.shared.status() if self.shared is not None else None}

    def _write_status(self, force: bool = False) -> None:
        self.heartbeat.maybe_write(self.status, force=force)

    def _status_loop(self) -> None:
        while not self.stop.wait(0.5):
            self._write_status()

    # --- the end ----------------------------------------------------------------------------
    def wait(self) -> None:
        """Until ``stop`` is set; in slices, so that the main thread runs a signal handler promptly."""
        while not self.stop.wait(0.5):
            pass

    def shutdown(self, join_timeout: float = 10.0) -> int:
        """Stop taking connections, end every connection (each gets a ``server_stopping`` error),
        close every bot with its final save, write the last status.  Returns the exit code of
        ``sacbot run``: 1 if a learner failed, 3 if a final save was not confirmed, else 0."""
        self.stop.set()
        for t in self._threads:  # the loop ends every connection (each gets server_stopping) within STOP_GRACE_S
            t.join(join_timeout + STOP_GRACE_S)
            if t.is_alive():
                log.warning("serve: thread %s did not end; closing the bots anyway", t.name)
        for s in self._listeners:
            s.close()
        if self.loop is not None:
            self.loop.close()
        if self.opts.socket_path:
            try:
                os.unlink(self.opts.socket_path)
            except OSError:
                pass
        deadline = time.monotonic() + join_timeout
        # A hello that was loading its bot, a step held for its learner: both see the stop.
        for t in self.loop.workers if self.loop is not None else []:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("serve: connection thread %s did not end; closing the bots anyway", t.name)
        bots = self.registry.close_all(self.cfg.final_save_timeout)
        # The shared learner saves after every bot has detached: nothing a bot sent is left out.
        shared = self.shared.close(self.cfg.final_save_timeout) if self.shared is not None else None
        self.stopped = time.time()
        self._write_status(force=True)
        code = 1 if self.registry.learner_failures else 0
        if shared is not None:
            last = shared.last_save if (shared.final_save or {}).get("ok") else None
            log.info("serve: the shared learner: %s gradient steps, %s transitions; final checkpoint: %s",
                     shared.learner_steps, shared.env_steps_received, last["path"] if last else "NOT WRITTEN")
            if shared.learner_error:
                log.error("serve: the shared learner failed: %s", shared.learner_error)
                code = 1
            elif not (shared.final_save or {}).get("ok"):
                log.error("serve: the shared learner's final checkpoint was NOT written (%s)",
                          (shared.final_save or {}).get("error", "unknown"))
                code = EXIT_SAVE_FAILED
        for b in bots:
            st = b.final or {}
            final = st.get("final_save") or {}
            last = st.get("last_save") if final.get("ok") else None
            log.info("serve: bot %s: %s ticks, %s episodes, %s gradient steps; final checkpoint: %s", b.name,
                     st.get("ticks"), st.get("episodes"), st.get("learner_steps", 0),
                     last["path"] if last else ("none (eval)" if self.cfg.eval_mode else "NOT WRITTEN"))
            if st.get("learner_error"):
                log.error("serve: bot %s: the learner failed: %s", b.name, st["learner_error"])
                code = 1
            elif not self.cfg.eval_mode and not final.get("ok") and code == 0:
                log.error("serve: bot %s: the final checkpoint was NOT written (%s); its newest checkpoint is "
                          "older than this run's work", b.name, final.get("error", "unknown"))
                code = EXIT_SAVE_FAILED
        return code
