"""The server's loop: every connection's I/O, and the steps that never wait (``sacbot-serve-loop``).

    loop = Loop(server, listeners)    # non-blocking listening sockets
    threading.Thread(target=loop.run, name="sacbot-serve-loop").start()
    ...                               # until server.stop is set: every connection gets server_stopping
    loop.close()                      # after the thread has ended

One selector over the listeners and every connection: it accepts, reads without blocking, cuts
frames, hands each message to the connection's :class:`~sacbot.serve.connection.Connection` and
writes the replies without blocking.  A message that may take long (a hello; a bot to retire;
every message where a step may wait for the learner) runs on a thread named for its connection,
``sacbot-serve-conn-<n>``, and the loop reads nothing more of that connection until the thread
hands the replies back.  The deadlines (idle, frame, a game that reads none of its replies) are
checked here every ``LOOP_TICK_S``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sacbot.serve import protocol as p
from sacbot.serve.connection import Connection, NeedsThread

if TYPE_CHECKING:
    from sacbot.serve.server import Server

log = logging.getLogger("sacbot")
LOOP_TICK_S = 0.05  # how often the loop looks at the deadlines (timeouts are seconds) and the stop
STOP_GRACE_S = 10.0  # at a stop, how long the loop waits for the games' last frames before it closes them
RECV_BYTES = 65536
THREAD_POLL_S = 0.25  # how soon a connection's own thread, idle, sees that its connection has closed
ACCEPTS_PER_TURN = 16
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Loop:
    def __init__(self, server: Server, listeners: list[socket.socket]):
        self.server, self.listeners = server, listeners
        self.links: dict[int, _Link] = {}  # the loop's alone: others read only its size
        self.workers: list[threading.Thread] = []  # connections' threads (hellos; lockstep and --hold-ms steps)
        self.refused = 0
        self._ids = itertools.count(1)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # a thread's finished message wakes the loop
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._done: queue.SimpleQueue[tuple[_Link, bool]] = queue.SimpleQueue()
        self._stop_by: float | None = None  # set when the loop sees the stop
        self._accept_paused_until = 0.0
        self._listening = False  # the listeners are in the selector
        self._accept_warned = -1e9
        self._max_buffered = server.opts.max_frame + 8 + RECV_BYTES  # past this, a busy connection's reads wait
        self._accepting(True)

    def close(self) -> None:
        """The wake-up pair's sockets (the listeners are the server's)."""
        for s in (self._wake_r, self._wake_w):
            s.close()

    def run(self) -> None:
        try:
            self._run_loop()
        except BaseException:
            log.exception("serve: the connection loop failed; stopping the server")
            self.server.stop.set()
            raise
        finally:
            for link in list(self.links.values()):
                self._close(link)
            self._sel.close()

    def _run_loop(self) -> None:
        next_check = 0.0
        while True:
            now = time.monotonic()
            if self.server.stop.is_set() and self._stop_by is None:
                self._stop_by = now + STOP_GRACE_S
                self._accepting(False)
                for link in list(self.links.values()):
                    self._pump(link)  # an idle one gets server_stopping; a busy one when its thread is done
            if self._stop_by is not None and (not self.links or now > self._stop_by):
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
                    try:
                        if mask & selectors.EVENT_WRITE:
                            self._flush(what)
                            self._pump(what)  # frames that waited for the replies before them to go out
                        if mask & selectors.EVENT_READ and not what.closed:
                            self._read(what)
                    except Exception as e:  # noqa: BLE001 - a fault of ours ends that connection, never the loop
                        self._internal_error(what, e)
            while True:
                try:
                    link, keep = self._done.get_nowait()
                except queue.Empty:
                    break
                link.busy = False
                if link.closed:
                    continue
                # Reading resumes now: the part of a next frame that came with this one has waited for
                # the thread, not for the game, so its deadline starts over.
                link.partial_since = time.monotonic() if len(link.frames) else None
                try:
                    self._take(link, keep)
                    self._pump(link)
                except Exception as e:  # noqa: BLE001 - as above
                    self._internal_error(link, e)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LOOP_TICK_S
                self._check_deadlines(now)

    def _accept(self, listener: socket.socket) -> None:
        # A few at a time: a flood of connections waits in the backlog between the games' steps.
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:  # ECONNABORTED and the like: that connection only
                    continue
                # Out of descriptors or memory: stop accepting for a moment rather than spin.
                now = time.monotonic()
                if now - self._accept_warned > 10.0:  # once per 10 s, not at every retry
                    self._accept_warned = now
                    log.warning("serve: accept failed: %s; connections wait in the listen backlog until "
                                "descriptors are free (raise the limit: ulimit -n)", e)
                self._accepting(False)
                self._accept_paused_until = time.monotonic() + 0.05
                return
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else f"unix:{self.server.opts.socket_path}"
            try:
                sock.setblocking(False)
                if sock.family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a reply is one small frame: send now
            except OSError:  # reset by the peer already
                sock.close()
                continue
            if len(self.links) >= self.server.opts.max_connections:
                # Answered at once, with no state kept: under a flood of connections a refusal costs one send.
                self.refused += 1
                err = p.ProtocolError("too_many_connections", f"this server takes {self.server.opts.max_connections} "
                                                              "connections at once (--max-connections), all in use; "
                                                              "expected a retry later")
                _send_and_close(sock, err.frame())
                continue
            cid = next(self._ids)
            now = time.monotonic()
            link = _Link(cid, sock, Connection(self.server, peer), p.FrameBuffer(self.server.opts.max_frame),
                         waiting_since=now)
            self.links[cid] = link
            self._interest(link)

    def _accepting(self, on: bool) -> None:
        if on == self._listening:
            return
        for s in self.listeners:
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
        while link.ready:
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
            if self.server.threaded:
                self._hand_over(link, msg)
                return
            try:
                keep = link.conn.process(msg)
            except NeedsThread:
                self._hand_over(link, msg)
                return
            self._take(link, keep)
        if link.eof and link.ready:
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
        if self.server.threaded:
            if link.inbox is None:
                link.inbox = queue.SimpleQueue()
                self._start_worker(link, self._conn_thread, link)
            link.inbox.put(msg)
            return
        self._start_worker(link, self._off_loop, link, msg)

    def _start_worker(self, link: _Link, target, *args) -> None:
        self.workers = [w for w in self.workers if w.is_alive()]  # pruned as threads are added, not per message
        t = threading.Thread(target=target, args=args, name=f"sacbot-serve-conn-{link.cid}", daemon=True)
        self.workers.append(t)
        t.start()

    def _off_loop(self, link: _Link, msg: dict) -> None:
        link.conn.on_loop = False
        try:
            self._process_and_hand_back(link, msg)
        finally:
            link.conn.on_loop = True

    def _conn_thread(self, link: _Link) -> None:
        link.conn.on_loop = False
        assert link.inbox is not None
        while not link.closed:
            try:
                msg = link.inbox.get(timeout=THREAD_POLL_S)
            except queue.Empty:
                continue
            self._process_and_hand_back(link, msg)

    def _process_and_hand_back(self, link: _Link, msg: dict) -> None:
        """On a connection's thread: ``msg``'s replies go back to the loop, which is woken for them."""
        keep = False
        try:
            keep = link.conn.process(msg)
        finally:
            self._done.put((link, keep))
            try:
                self._wake_w.send(b"\0")
            except OSError:  # full (the loop has a wake-up pending anyway), or closed at the end
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
            if n:
                link.send_since = None  # a game that reads, however slowly, is not dropped
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
        ft, it = self.server.opts.frame_timeout, self.server.opts.idle_timeout
        for link in list(self.links.values()):
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

    def _internal_error(self, link: _Link, e: Exception) -> None:
        log.error("serve: %s: internal error in the connection loop: %s: %s", link.conn.peer, type(e).__name__, e,
                  exc_info=True)
        if link.closed or link.busy:  # a busy link has no events and no result being taken: not reached
            return
        try:
            link.conn.fail(p.ProtocolError("internal", f"the server failed on this connection ({type(e).__name__}: "
                                                       f"{e}); this is a bug in sacbot, please report it"), quiet=True)
            self._take(link, False)  # one try to send the error frame: the connection is closed next
        except Exception:  # noqa: BLE001, S110 - the close below is what matters
            pass
        self._close(link)

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
        self.links.pop(link.cid, None)


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
    def ready(self) -> bool:
        """It may take its next frame: nothing of it runs on a thread or waits to be sent, and it is open."""
        return not (self.busy or self.closing or self.closed or self.out)


def _send_and_close(sock: socket.socket, msg: dict) -> None:
    """One frame to a non-blocking socket, then close (a frame this small fits an empty send buffer)."""
    try:
        sock.send(p.encode_frame(msg))
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()
