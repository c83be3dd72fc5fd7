"""``sacbot serve``: games in any language connect over a local socket and get an action per tick.

    server = Server(cfg, ServeOptions(root="runs/serve", port=0), stop)
    server.start()                 # binds; ServeError if it cannot (port in use, a file in the way)
    server.port                    # the TCP port bound (with port 0: the one the system chose)
    server.wait()                  # until ``stop`` is set
    code = server.shutdown()       # every bot's final save; sacbot run's exit codes

Threads, all named: ``sacbot-serve-loop`` runs one selector over the listeners and every
connection: it accepts, reads and writes without blocking, and runs each step itself (a step is
an ``act()``, fast numpy).  Thirty-two games at 30 ticks a second cost it about a thousand short
calls a second; a thread per game cost as many thread wake-ups and GIL hand-offs, and made ticks
late on a busy machine.  What may take long runs on a ``sacbot-serve-conn-<n>`` thread while the
loop serves the others: a hello (it loads a bot and may start its learner), a bot's retirement
(its final save), and, where a step may wait for the learner (``--pace lockstep``, ``--hold-ms``),
that connection's every message.  ``sacbot-serve-status`` writes ``ROOT/status.json`` once a
second.  The wire protocol is in :mod:`sacbot.serve.protocol` and docs/protocol.md.  Nothing here
imports torch: the bots' learners are built by the same assembly an Agent uses (``--learner thread``
or ``process``).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import queue
import selectors
import socket
import stat
import threading
import time
from dataclasses import dataclass, field

from sacbot import __version__
from sacbot.config import Config
from sacbot.serve import DEFAULT_PORT, MAX_FRAME
from sacbot.serve import protocol as p
from sacbot.serve.bots import BotRegistry
from sacbot.serve.connection import Connection, NeedsThread
from sacbot.store.liveness import Heartbeat

log = logging.getLogger("sacbot")
EXIT_SAVE_FAILED = 3  # as sacbot run: a final checkpoint was not written, or not confirmed
LOOP_TICK_S = 0.05  # how often the loop looks at the deadlines (timeouts are seconds) and the stop
STOP_GRACE_S = 10.0  # at a stop, how long the loop waits for the games' last frames before it closes them
RECV_BYTES = 65536


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


class Server:
    def __init__(self, cfg: Config, opts: ServeOptions, stop: threading.Event):
        self.cfg, self.opts, self.stop = cfg, opts, stop
        self.shared = None
        if opts.shared_learner:
            from sacbot.serve.shared import SharedLearner

            self.shared = SharedLearner(cfg, opts.root, stop)
        self.registry = BotRegistry(cfg, opts.root, stop, opts.max_bots, shared=self.shared)
        self.port: int | None = None
        self._listeners: list[socket.socket] = []
        self._links: dict[int, _Link] = {}  # the loop's alone: others read only its size
        self._ids = itertools.count(1)
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []  # connections' threads (hellos; lockstep and --hold-ms steps)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # a thread's finished message wakes the loop
        self._done: queue.SimpleQueue[tuple[_Link, bool]] = queue.SimpleQueue()
        self._stop_by: float | None = None  # set by the loop when it sees the stop
        self._accept_paused_until = 0.0
        self._listening = False  # the listeners are in the selector
        self._accept_warned = -1e9
        self._max_buffered = opts.max_frame + 8 + RECV_BYTES  # past this, a busy connection's reads wait
        # Where a step may wait for the learner, each connection's messages run on a thread of its own
        # (the Agent serves one thread); elsewhere the loop itself runs them: a step is a fast numpy act().
        self.threaded = not cfg.eval_mode and (cfg.pace == "lockstep" or (opts.hold_ms > 0 and cfg.pace == "learner"))
        self.started = time.time()
        self.refused = 0
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
        self._accepting(True)
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._write_status()
        for name, target in (("sacbot-serve-loop", self._loop), ("sacbot-serve-status", self._status_loop)):
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

    # --- the loop: every connection's I/O, and the steps that never wait ----------------------
    def _loop(self) -> None:
        try:
            self._run_loop()
        except BaseException:
            log.exception("serve: the connection loop failed; stopping the server")
            self.stop.set()
            raise
        finally:
            for link in list(self._links.values()):
                self._close(link)
            self._sel.close()

    def _run_loop(self) -> None:
        next_check = 0.0
        while True:
            now = time.monotonic()
            if self.stop.is_set() and self._stop_by is None:
                self._stop_by = now + STOP_GRACE_S
                self._accepting(False)
                for link in list(self._links.values()):
                    self._pump(link)  # an idle one gets server_stopping; a busy one when its thread is done
            if self._stop_by is not None and (not self._links or now > self._stop_by):
                return
            for key, mask in self._sel.select(timeout=LOOP_TICK_S):
                what = key.data
                if what is None:
                    self._accept(key.fileobj)
                elif what is self._wake_r:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                else:
                    if mask & selectors.EVENT_WRITE:
                        self._flush(what)
                        self._pump(what)  # frames that waited for the replies before them to go out
                    if mask & selectors.EVENT_READ and not what.closed:
                        self._read(what)
            while True:
                try:
                    link, keep = self._done.get_nowait()
                except queue.Empty:
                    break
                link.busy = False
                if not link.closed:
                    self._take(link, keep)
                    self._pump(link)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LOOP_TICK_S
                self._check_deadlines(now)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE: out of descriptors; stop accepting for a moment rather than spin
                now = time.monotonic()
                if now - self._accept_warned > 10.0:  # once per 10 s, not at every retry
                    self._accept_warned = now
                    log.warning("serve: accept failed: %s; connections wait in the listen backlog until "
                                "descriptors are free (raise the limit: ulimit -n)", e)
                self._accepting(False)
                self._accept_paused_until = time.monotonic() + 0.05
                return
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else f"unix:{self.opts.socket_path}"
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a reply is one small frame: send it now
            if len(self._links) >= self.opts.max_connections:
                # Answered at once, with no state kept: under a flood of connections a refusal costs one send.
                self.refused += 1
                err = p.ProtocolError("too_many_connections", f"this server takes {self.opts.max_connections} "
                                                              "connections at once (--max-connections), all in use; "
                                                              "expected a retry later")
                _send_and_close(sock, err.frame())
                continue
            cid = next(self._ids)
            now = time.monotonic()
            link = _Link(cid, sock, Connection(self, peer), p.FrameBuffer(self.opts.max_frame), waiting_since=now)
            self._links[cid] = link
            self._interest(link)

    def _accepting(self, on: bool) -> None:
        if on == self._listening:
            return
        for s in self._listeners:
            if on:
                self._sel.register(s, selectors.EVENT_READ, None)
            else:
                self._sel.unregister(s)
        self._listening = on

    def _read(self, link: _Link) -> None:
        try:
            data = link.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # reset by the peer
            self._lost(link, str(e))
            return
        if not data:
            link.eof = True
        else:
            if not len(link.frames):
                link.partial_since = time.monotonic()
            link.frames.feed(data)
        self._pump(link)

    def _pump(self, link: _Link) -> None:
        """Handle ``link``'s whole frames, one at a time, while nothing of it is pending."""
        while not (link.busy or link.closing or link.closed or link.out):
            if self._stop_by is not None:
                link.conn.fail(p.ProtocolError("server_stopping", "the server is stopping; expected a reconnect "
                                                                  "once it is back"))
                self._take(link, False)
                return
            try:
                body = link.frames.next()
                if body is None:
                    break
                link.partial_since = time.monotonic() if len(link.frames) else None
                msg = p.decode_body(body)
            except p.ProtocolError as e:
                link.conn.fail(e)
                self._take(link, False)
                return
            if link.threaded:
                self._hand_over(link, msg)
                return
            try:
                keep = link.conn.process(msg)
            except NeedsThread:
                self._hand_over(link, msg)
                return
            self._take(link, keep)
        if link.eof and not (link.busy or link.closing or link.closed or link.out):
            if len(link.frames):
                log.info("serve: %s: the connection was closed in the middle of a frame", link.conn.peer)
            link.conn.end()
            self._close(link)
            return
        if not link.closed:
            self._interest(link)

    def _hand_over(self, link: _Link, msg: dict) -> None:
        """Run ``msg`` on a thread: the connection's own (lockstep, --hold-ms: its every message), or
        one for this message alone (a hello, a bot to retire).  The loop takes the replies back."""
        link.busy = True
        self._interest(link)
        self._workers = [w for w in self._workers if w.is_alive()]
        if link.threaded:
            if link.inbox is None:
                link.inbox = queue.SimpleQueue()
                t = threading.Thread(target=self._conn_thread, args=(link,), name=f"sacbot-serve-conn-{link.cid}",
                                     daemon=True)
                self._workers.append(t)
                t.start()
            link.inbox.put(msg)
            return
        t = threading.Thread(target=self._off_loop, args=(link, msg), name=f"sacbot-serve-conn-{link.cid}",
                             daemon=True)
        self._workers.append(t)
        t.start()

    def _off_loop(self, link: _Link, msg: dict) -> None:
        keep = False
        link.conn.on_loop = False
        try:
            keep = link.conn.process(msg)
        finally:
            link.conn.on_loop = True
            self._done.put((link, keep))
            self._wake()

    def _conn_thread(self, link: _Link) -> None:
        link.conn.on_loop = False
        assert link.inbox is not None
        while not link.closed:
            try:
                msg = link.inbox.get(timeout=p.POLL_S)
            except queue.Empty:
                continue
            keep = False
            try:
                keep = link.conn.process(msg)
            finally:
                self._done.put((link, keep))
                self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):  # full: the loop has a wake-up pending anyway
            pass

    def _take(self, link: _Link, keep: bool) -> None:
        """Queue the connection's replies and send what the socket takes now."""
        if link.conn.outbox:
            link.out += b"".join(link.conn.outbox)
            link.conn.outbox.clear()
        link.waiting_since = time.monotonic()
        if not keep and not link.closing:
            link.closing, link.closing_since = True, link.waiting_since
        self._flush(link)

    def _flush(self, link: _Link) -> None:
        while link.out:
            try:
                n = link.sock.send(link.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._lost(link, str(e))
                return
            del link.out[:n]
        if link.out:
            link.send_since = link.send_since or time.monotonic()
        else:
            link.send_since = None
            if link.closing:
                self._close(link)
                return
        self._interest(link)

    def _check_deadlines(self, now: float) -> None:
        if self._accept_paused_until and now >= self._accept_paused_until and self._stop_by is None:
            self._accept_paused_until = 0.0
            self._accepting(True)
        ft, it = self.opts.frame_timeout, self.opts.idle_timeout
        for link in list(self._links.values()):
            if link.busy or link.closed:
                continue
            if link.closing and now - link.closing_since > ft:
                self._close(link)  # its last frame (an error, a bye) could not be sent in time
            elif link.send_since is not None and now - link.send_since > ft:
                self._lost(link, f"the game read nothing of its replies for {ft:g} s (--frame-timeout)")
            elif link.partial_since is not None and now - link.partial_since > ft:
                link.conn.fail(p.frame_timeout_error(ft, len(link.frames), link.frames.expected()))
                self._take(link, False)
            elif link.partial_since is None and now - link.waiting_since > it:
                link.conn.fail(p.idle_timeout_error(it))
                self._take(link, False)

    def _lost(self, link: _Link, why: str) -> None:
        log.info("serve: %s: connection lost: %s", link.conn.peer, why)
        link.conn.end()
        self._close(link)

    def _interest(self, link: _Link) -> None:
        events = 0
        if not (link.busy or link.closing or link.eof or link.out) and len(link.frames) < self._max_buffered:
            events |= selectors.EVENT_READ
        if link.out:
            events |= selectors.EVENT_WRITE
        if events == link.events:
            return
        if link.events == 0:
            self._sel.register(link.sock, events, link)
        elif events == 0:
            self._sel.unregister(link.sock)
        else:
            self._sel.modify(link.sock, events, link)
        link.events = events

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        if link.events:
            self._sel.unregister(link.sock)
            link.events = 0
        try:
            link.sock.close()
        except OSError:
            pass
        self._links.pop(link.cid, None)

    # --- status ---------------------------------------------------------------------------
    def status(self) -> dict:
        bots = {b.name: b.summary() for b in self.registry.bots()}
        n = len(self._links)
        return {"kind": "serve", "pid": os.getpid(), "time": time.time(), "started": self.started,
                "mode": "eval" if self.cfg.eval_mode else "train", "protocol": p.PROTOCOL_VERSION,
                "sacbot_version": __version__, "listen": self.addresses(), "port": self.port,
                "socket": self.opts.socket_path, "connections": n, "refused_connections": self.refused,
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
        for s in (self._wake_r, self._wake_w):
            s.close()
        if self.opts.socket_path:
            try:
                os.unlink(self.opts.socket_path)
            except OSError:
                pass
        deadline = time.monotonic() + join_timeout
        for t in self._workers:  # a hello that was loading its bot, a step held for its learner: both see stop
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


@dataclass(eq=False)
class _Link:
    """The loop's side of one connection: its socket, its bytes in and out, and its deadlines."""

    cid: int
    sock: socket.socket
    conn: Connection
    frames: p.FrameBuffer
    waiting_since: float  # since then it waits for the game's next frame (the idle timeout's start)
    out: bytearray = field(default_factory=bytearray)
    partial_since: float | None = None  # the first byte of a frame not yet whole
    send_since: float | None = None  # replies waiting for the game to read
    busy: bool = False  # a message of its runs on a thread
    inbox: queue.SimpleQueue | None = None  # its own thread's messages (lockstep, --hold-ms)
    eof: bool = False  # the game closed its side
    closing: bool = False  # read no more: close once ``out`` is sent
    closing_since: float = 0.0
    closed: bool = False
    events: int = 0  # the selector's interest now

    @property
    def threaded(self) -> bool:
        return self.conn.server.threaded


def _send_and_close(sock: socket.socket, msg: dict) -> None:
    """One frame to a non-blocking socket, then close (a frame this small fits an empty send buffer)."""
    try:
        sock.send(p.encode_frame(msg))
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()
