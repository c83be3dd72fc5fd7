"""The process learner: the learner boundary (:mod:`sacbot.wire.boundary`) in a child process.

    learner = ProcessLearner(spec, resume_path, queue_size=256, pace="free")
    learner.send([NewEpisode("tracker"), transition])   # the boundary, as in learner.py
    final = learner.close(acting_rng)

Why a process: acting then has an interpreter of its own and never waits for the training loop's
GIL (torch on the acting thread beside a training thread measured p99 ~9 ms per act).  The parent side imports no
torch; the child builds the learner, the replay and the I/O thread itself.

Transport (docs/design.md says why; BENCHMARKS.md has the measurements): two one-way ``multiprocessing`` pipes
of msgpack bytes, made with the ``spawn`` start method (no fork of a process holding threads).

* bot -> learner: a *sender* thread drains the bounded outgoing queue and writes each batch as one
  msgpack array (:func:`sacbot.wire.messages.encode_batch`).  A full pipe blocks the sender, never the
  acting thread: the queue fills and drops are counted, as with the thread learner.
* learner -> bot: ``["snap", version, arrays]`` and ``["status", dict]``, read by a *receiver*
  thread that publishes into the local snapshot and status.  Outside lockstep, snapshots are sent
  at most every ``SNAPSHOT_PERIOD_S`` (the newest one always goes out); in lockstep after every
  pass, so both learners give the same run.

The child exits after the final save when it gets ``Shutdown``, and also when its parent is gone
(the pipe closes, or the parent PID changes): it then saves what it has, so killing a bot with
``kill -9`` leaves no orphan and loses no more than the messages in flight.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

from sacbot.wire.boundary import LearnerLink, LearnerSpec, not_confirmed
from sacbot.wire.messages import MessageError, Shutdown, decode_batch, encode_batch, pack, unpack
from sacbot.wire.status import LearnerStatus

log = logging.getLogger("sacbot")
SNAPSHOT_PERIOD_S = 0.02  # 50 weight updates a second reach acting; each is ~10-100 KB of msgpack
MAX_PIPE_MESSAGE = 1 << 30


class ProcessLearner(LearnerLink):
    kind = "process"

    def __init__(self, spec: LearnerSpec, resume_path: str | None, queue_size: int, pace: str = "free"):
        super().__init__(queue_size)
        ctx = multiprocessing.get_context("spawn")
        to_child_r, self._to_child = ctx.Pipe(duplex=False)
        self._from_child, from_child_w = ctx.Pipe(duplex=False)
        self._closing = ctx.Event()  # the child's LearnerLoop.closing: a close ends its pass at once
        self._closed = threading.Event()
        self.proc = ctx.Process(target=child_main, name="sacbot-learner",
                                args=(spec, resume_path, to_child_r, from_child_w, os.getpid(), pace, self._closing))
        try:
            self.proc.start()
        finally:
            to_child_r.close()  # the child holds these ends now: EOF on either side means the other is gone
            from_child_w.close()
        self._child = Reaper(self.proc)
        self._sender = threading.Thread(target=self._send_loop, name="sacbot-sender", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name="sacbot-receiver", daemon=True)
        try:
            self._sender.start()
            self._receiver.start()
        except BaseException:  # no thread to talk to the child: it must not outlive this failure
            self.abort(30.0)
            raise

    # --- bot -> learner ------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            msg = self.outbox.recv(timeout=0.2)
            if msg is None:
                if self._closed.is_set() or self._child.exitcode(0.0) is not None:
                    return
                continue
            batch = [msg] + self.outbox.drain()
            try:
                for data in encode_runs(batch):
                    self._to_child.send_bytes(data)
            except (OSError, ValueError):  # the child is gone (or we closed the pipe): said so
                if not self._closed.is_set():
                    self._dead()
                return
            if any(isinstance(m, Shutdown) for m in batch):
                return

    # --- learner -> bot ------------------------------------------------------------------------
    def _receive_loop(self) -> None:
        while True:
            try:
                data = self._from_child.recv_bytes(MAX_PIPE_MESSAGE)
            except (EOFError, OSError):
                break
            try:
                kind, *rest = unpack(data)
                if kind == "snap":
                    self.publish(rest[1])
                elif kind == "status":
                    self.push_status(rest[0])
            except (MessageError, ValueError, TypeError, IndexError) as e:
                log.error("bad message from the learner process: %s", e)
        self._dead()

    def _dead(self) -> None:
        """The child is gone without its closing word (killed, crashed): say so in the status."""
        code = self._child.exitcode(5.0)
        if not self._status.closed:
            why = (f"the learner process exited with code {code}; acting goes on with the "
                   "last weights, and nothing more is learned or saved")
            self.push_status({"learner_alive": False, "learner_error": why, "last_error": why})

    # --- the rest of the boundary --------------------------------------------------------------
    def close(self, acting_rng: str | None = None, timeout: float = 60.0) -> LearnerStatus:
        """Shutdown, the child's final save and its exit, all within ``timeout`` s.  A child that
        has not finished by then (stopped, stuck on a slow disk) is killed: the bot exits on time
        and its directory is free for the next start, which goes on from the last confirmed save."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        self.outbox.send(Shutdown(acting_rng or ""), control_wait=timeout / 2)
        self._closing.set()  # a pass in progress ends at its next step; the rest stays owed
        self._closed.set()
        self._sender.join(left())
        if not self._sender.is_alive():
            self._to_child.close()  # EOF: a child that never got the Shutdown still drains and saves
        code = self._child.exitcode(left())
        late = None
        if code is None:
            log.error("the learner process (pid %s) did not finish its final save within the %g s deadline; "
                      "killing it", self.proc.pid, timeout)
            late = not_confirmed(timeout, f"the learner process {self.proc.pid} did not finish in time and was "
                                          "killed")
            self.push_status({"learner_alive": False, "closed": True, "final_save": late})
            code = self._stop_child()
        self._end_threads(5.0)
        st = self.status()
        if late is not None:
            return st.but(final_save=late)
        if st.final_save is None:
            return st.but(final_save={"ok": False, "error": f"the learner process exited with code {code} "
                                                            "before reporting its final save"})
        return st

    def abort(self, timeout: float) -> bool:
        """End the child without a final save (the bot failed to start: nothing may be written) and
        reap it; True once it is gone and the pipe threads have ended."""
        self._closed.set()
        self.push_status({"learner_alive": False, "closed": True,
                          "final_save": {"ok": False, "error": "the bot failed to start; nothing was saved"}})
        code = self._stop_child(timeout)
        if code is None:
            log.error("the learner process %s did not exit within %g s of a failed start", self.proc.pid, timeout)
        return self._end_threads(timeout) and code is not None

    def _stop_child(self, timeout: float = 5.0) -> int | None:
        """SIGKILL (a stopped process too) and reap; the exit code, or None if it outlived ``timeout``."""
        if self.proc.pid is None:
            return 0  # never started
        try:
            self.proc.kill()
        except (OSError, ValueError):
            pass  # already reaped
        return self._child.exitcode(timeout)

    def _end_threads(self, timeout: float) -> bool:
        """Join the pipe threads (their ends close when the child is gone) and close our ends."""
        deadline = time.monotonic() + timeout
        for t in (getattr(self, "_sender", None), getattr(self, "_receiver", None)):
            if t is not None and t.ident is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in (getattr(self, "_sender", None), getattr(self, "_receiver", None))
                 if t is not None and t.is_alive()]
        if alive:
            log.error("%s did not end within %g s", " and ".join(alive), timeout)
            return False
        self._to_child.close()
        self._from_child.close()
        return True


class Reaper:
    """Waits for a child process from any thread.  ``Process.join``/``is_alive`` call waitpid,
    which hands the exit code to one caller only: a second thread waiting at the same moment read
    exitcode None (CI, after a kill -9).  One lock serializes the waits."""

    def __init__(self, proc: multiprocessing.process.BaseProcess):
        self.proc = proc
        self._lock = threading.Lock()

    def exitcode(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s; the exit code, or None while the child runs."""
        with self._lock:
            self.proc.join(timeout)
            return self.proc.exitcode


# --- the pipe's bytes ---------------------------------------------------------------------------
def encode_runs(batch: list) -> list[bytes]:
    """A batch of the outgoing queue as pipe messages.  An item is a Message, or a (source, Message)
    pair when many bots feed this learner (sacbot serve --shared-learner): each run of one source's
    items goes as ``{"source": s, "batch": encode_batch(run)}``, so the child knows whose rows they are."""
    out: list[bytes] = []
    for source, run in itertools.groupby(batch, key=lambda item: item[0] if isinstance(item, tuple) else None):
        if source is None:
            out.append(encode_batch(list(run)))
        else:
            out.append(pack({"source": source, "batch": encode_batch([m for _, m in run])}))
    return out


def decode_run(data: bytes) -> list:
    """One pipe message of :func:`encode_runs`: Messages, or (source, Message) pairs."""
    if not data or not (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)):  # not a msgpack map: one bot's
        return decode_batch(data)
    head = unpack(data)
    source, inner = head.get("source"), head.get("batch")
    if type(source) is not int or source < 0 or not isinstance(inner, bytes):
        raise MessageError(f"a sourced batch needs an int source >= 0 and a bytes batch, got {source!r} and "
                           f"{type(inner).__name__}")
    return [(source, m) for m in decode_batch(inner)]


# --- the child ----------------------------------------------------------------------------------
class _ChildPipes:
    """The child's ends: an inbox for :class:`LearnerLoop` (``recv``/``drain``) and the outbox
    (``publish``/``push_status``).  A closed pipe or a new parent PID reads as ``Shutdown``."""

    def __init__(self, conn_in: Connection, conn_out: Connection, parent_pid: int, lockstep: bool):
        self.conn_in, self.conn_out, self.parent_pid = conn_in, conn_out, parent_pid
        self.period = 0.0 if lockstep else SNAPSHOT_PERIOD_S
        self._buffered: list = []
        self._version = 0
        self._pending: dict | None = None
        self._last_sent = 0.0
        self.parent_gone = False
        self.terminated = False

    def _orphaned(self) -> list:
        self.parent_gone = True
        return [Shutdown("")]

    def terminate(self) -> None:
        """SIGTERM: the next receive is a Shutdown (the loop drains, saves and ends)."""
        self.terminated = True

    def recv(self, timeout: float):
        if self.terminated:  # what already came goes in first, then the Shutdown
            self.terminated = False
            self._buffered = self.drain() + [Shutdown("")]
        if self._buffered:
            return self._buffered.pop(0)
        self._flush(wait=True)
        try:
            if os.getppid() != self.parent_pid:
                return self._orphaned()[0]
            if not self.conn_in.poll(timeout):
                return None
            self._buffered = decode_run(self.conn_in.recv_bytes(MAX_PIPE_MESSAGE))
        except (EOFError, OSError):
            self._buffered = self._orphaned()
        return self._buffered.pop(0) if self._buffered else None

    def drain(self) -> list:
        out, self._buffered = self._buffered, []
        try:
            while self.conn_in.poll(0):
                out += decode_run(self.conn_in.recv_bytes(MAX_PIPE_MESSAGE))
        except (EOFError, OSError):
            out += self._orphaned()
        return out

    def publish(self, arrays: dict) -> int:
        self._version += 1
        self._pending = arrays
        self._flush(wait=False)
        return self._version

    def _flush(self, wait: bool) -> None:
        if self._pending is None:
            return
        left = self._last_sent + self.period - time.monotonic()
        if left > 0:
            if not wait:
                return
            time.sleep(left)  # at most SNAPSHOT_PERIOD_S: the newest actor goes out before we block
        self._send(["snap", self._version, self._pending])
        self._pending, self._last_sent = None, time.monotonic()

    def push_status(self, status: LearnerStatus | dict) -> None:
        """Over the pipe as plain data; the parent lays it over its record (LearnerLink.push_status)."""
        status = status.to_dict() if isinstance(status, LearnerStatus) else status
        if status.get("closed"):
            self._flush(wait=True)  # the last actor before the last word
        self._send(["status", status])

    def _send(self, obj) -> None:
        try:
            self.conn_out.send_bytes(pack(obj))
        except (OSError, ValueError):
            self.parent_gone = True  # nobody reads any more; the loop still finishes its save


def child_main(spec: LearnerSpec, resume_path: str | None, conn_in: Connection, conn_out: Connection,
               parent_pid: int, pace: str, closing=None) -> None:
    """Entry point of the learner process (spawned: a fresh interpreter that imports torch)."""
    # Signals to the whole process group (Ctrl-C in a terminal, systemd's stop) reach us too.
    # SIGINT is the bot's to handle: it closes us with a Shutdown.  SIGTERM alone (the bot is
    # gone or stuck) ends the loop as a Shutdown would: drain, final save, exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(stream=sys.stderr, format="sacbot: %(message)s", level=logging.INFO)
    from sacbot.learning.priority import yield_cpu_to_acting
    from sacbot.learning.training import LearnerLoop
    from sacbot.store.errors import CheckpointError
    from sacbot.store.lock import LockHeld, WriterLock
    from sacbot.store.read import read_checkpoint

    # First, on the main thread: the pipe threads started next, and torch's, inherit it.
    cfg = spec.cfg()
    nice = yield_cpu_to_acting(cfg.learner_nice, cfg.learner_idle)
    pipes = _ChildPipes(conn_in, conn_out, parent_pid, lockstep=(pace == "lockstep"))
    signal.signal(signal.SIGTERM, lambda *_: pipes.terminate())
    lock = WriterLock(spec.weights_dir)
    try:
        lock.acquire_within(30.0)  # the parent let go of it just before starting us
        ckpt = read_checkpoint(resume_path) if resume_path else None
    except (LockHeld, CheckpointError, OSError) as e:
        pipes.push_status({"learner_alive": False, "start_error": str(e), "start_error_kind": "other",
                           "closed": True, "final_save": {"ok": False, "error": "the learner never started"}})
        sys.exit(1)
    loop = LearnerLoop(spec, ckpt, pipes, pipes.publish, pipes.push_status, threading.Event())
    if closing is not None:
        loop.closing = closing  # the parent's close ends a pass in progress (LearnerLoop.closing)
    loop.nice, loop.priority_set = nice, True
    del ckpt
    try:
        loop.run()
    finally:
        lock.close()
        conn_out.close()
    sys.exit(1 if loop.error else 0)

