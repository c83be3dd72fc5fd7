"""The wire protocol of ``sacbot serve`` (docs/protocol.md is its specification).

A frame is a 4-byte big-endian unsigned length N (1 <= N <= the server's ``max_frame``), then N
bytes of msgpack holding one map with a string ``type``.  Both sides use the same frames::

    sock.sendall(encode_frame({"type": "hello", ...}))
    reader = FrameReader(sock, max_frame=MAX_FRAME)
    msg = decode_body(reader.read(idle_timeout=60, frame_timeout=10))

Everything a client sends is checked here before the server acts on it, and a refusal is a
:class:`ProtocolError` whose ``code`` and ``message`` (what was wrong, and what is expected) go
back to the client as an ``error`` frame.  Nothing here imports torch or knows about the Agent.
"""

from __future__ import annotations

import math
import re
import socket
import struct
import time
from dataclasses import dataclass

import msgpack
import numpy as np

from sacbot.serve import MAX_FRAME, PROTOCOL_VERSION
from sacbot.wire.messages import (
    MAX_ABS_OBS,
    MessageError,
    check_flag,
    check_opponent,
    check_reward,
    check_vector,
    shown,
)

__all__ = ["MAX_FRAME", "PROTOCOL_VERSION", "ProtocolError", "PeerClosed", "FrameBuffer", "FrameReader", "encode_frame",
           "decode_body", "BoxSpec", "Hello", "Step", "check_hello", "check_new_episode", "check_step"]
MAX_OBS_VALUES = 100_000
MAX_ACTION_DIMS = 1024
MAX_TOKEN_CHARS = 1024
# A bot's name becomes a directory under --root: one safe path component, never "." or "..", and
# without dots at all, so that it can never collide with the server's own files there (status.json).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A refusal: ``code`` (a stable identifier, docs/protocol.md lists them) and ``message`` (what
    was wrong and what is expected).  The server sends it as an error frame and closes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    def frame(self) -> dict:
        return {"type": "error", "code": self.code, "message": self.message}


class PeerClosed(Exception):
    """The other side closed the connection (between frames when ``clean``)."""

    def __init__(self, clean: bool):
        super().__init__("the connection was closed" + ("" if clean else " in the middle of a frame"))
        self.clean = clean


def encode_frame(msg: dict) -> bytes:
    """``msg`` as one frame: length prefix and msgpack body (floats as float64)."""
    body = msgpack.packb(msg, use_bin_type=True)
    return _HEADER.pack(len(body)) + body


def _no_ext(code: int, data: bytes):
    raise ValueError(f"msgpack extension type {code} is not part of the protocol")


def decode_body(body: bytes) -> dict:
    """One frame's body as a message map with a string ``type``, or ProtocolError("bad_frame")."""
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=_no_ext, timestamp=0)
    except Exception as e:  # noqa: BLE001 - any undecodable body (ExtraData, bad UTF-8, deep nesting) is refused
        raise ProtocolError("bad_frame", f"the frame's body is not one msgpack value ({type(e).__name__}: "
                                         f"{str(e)[:200]}); expected one msgpack map with a string 'type'") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_frame", f"the frame holds a msgpack {type(msg).__name__}; expected a map with a "
                                         "string 'type'")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_frame", f"the message has type = {shown(msg.get('type'), 80)}; expected a string, one "
                                         "of hello, new_episode, step, close")
    return msg


class FrameBuffer:
    """Frames cut from bytes as they come, for a reader that never blocks (the server's loop)::

        buf = FrameBuffer(max_frame)
        buf.feed(sock.recv(65536))
        while (body := buf.next()) is not None:   # ProtocolError: a length over max_frame, or 0
            handle(decode_body(body))

    Bytes past a frame are kept for the next one, so a client may pipeline."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self.max_frame = max_frame
        self._buf = bytearray()
        self._size: int | None = None  # the announced length of the frame being received

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> bytes | None:
        """The next whole frame's body, or None until more bytes come."""
        if self._size is None:
            if len(self._buf) < _HEADER.size:
                return None
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self.max_frame:
                raise ProtocolError("frame_too_large", f"a frame of {size:,} bytes was announced; expected at most "
                                                       f"{self.max_frame:,} bytes (the 4-byte length counts the "
                                                       "msgpack body only)")
            if size == 0:
                raise ProtocolError("bad_frame", "a frame of length 0 was announced; expected 1 or more bytes of "
                                                 "msgpack")
            self._size = size
        need = _HEADER.size + self._size
        if len(self._buf) < need:
            return None
        body = bytes(self._buf[_HEADER.size:need])
        del self._buf[:need]
        self._size = None
        return body

    def expected(self) -> int:
        """The bytes the frame being received needs in all (its header's 4 until that is known)."""
        return _HEADER.size + (self._size or 0)


def frame_timeout_error(frame_timeout: float, got: int, need: int) -> ProtocolError:
    return ProtocolError("frame_timeout", f"a frame was not complete {frame_timeout:g} s after its first byte ({got} "
                                          f"of {need} bytes came); expected a whole frame within {frame_timeout:g} s "
                                          "of its first byte")


def idle_timeout_error(idle_timeout: float) -> ProtocolError:
    return ProtocolError("idle_timeout", f"nothing was received for {idle_timeout:g} s; expected a frame at least "
                                         f"every {idle_timeout:g} s")


class FrameReader:
    """Reads frames from a blocking socket (the clients' side) with two deadlines: ``idle_timeout``
    for the first byte of a frame (a peer that sends nothing), and ``frame_timeout`` from that byte
    to the frame's last."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME):
        self.sock = sock
        self._frames = FrameBuffer(max_frame)

    def read(self, idle_timeout: float, frame_timeout: float) -> bytes:
        """The next frame's body.  Raises ProtocolError (frame_too_large, bad_frame, idle_timeout,
        frame_timeout), PeerClosed, or OSError."""
        first = time.monotonic() if len(self._frames) else None
        deadline = (first + frame_timeout) if first is not None else time.monotonic() + idle_timeout
        while True:
            body = self._frames.next()
            if body is not None:
                return body
            now = time.monotonic()
            if now >= deadline:
                if first is None:
                    raise idle_timeout_error(idle_timeout)
                raise frame_timeout_error(frame_timeout, len(self._frames), self._frames.expected())
            self.sock.settimeout(deadline - now)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise PeerClosed(clean=not len(self._frames))
            if first is None:
                first = time.monotonic()
                deadline = first + frame_timeout
            self._frames.feed(chunk)


# --- message checks -------------------------------------------------------------------------
def _bad(message: str) -> ProtocolError:
    return ProtocolError("bad_message", message)


def _field(msg: dict, key: str, kind: str, *, required: bool = True, allow_nil: bool = False):
    """``msg[key]``; refused when missing (and ``required``) or nil (unless ``allow_nil``)."""
    if key not in msg:
        if required:
            raise _bad(f"{msg['type']} has no field '{key}'; expected {kind}")
        return None
    v = msg[key]
    if v is None and not allow_nil:
        raise _bad(f"{msg['type']}.{key} is nil; expected {kind}")
    return v


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_NUMBER_TYPES = frozenset((int, float))


def numbers(where: str, v, n: int) -> np.ndarray:
    """A flat msgpack array of ``n`` numbers (int or float; never bool, string or nil) as float64."""
    if not isinstance(v, list):
        raise _bad(f"{where} is a {type(v).__name__}; expected an array of {n} numbers")
    if len(v) != n:
        raise _bad(f"{where} has {len(v)} values; expected {n} (the space's shape, flattened in row-major order)")
    # The types in C first (msgpack gives exact float and int, never a subclass); the loop in Python,
    # which names the first bad value, only for an array that fails it.
    if not _NUMBER_TYPES.issuperset(map(type, v)):
        for i, x in enumerate(v):
            if not _is_number(x):
                raise _bad(f"{where}[{i}] = {shown(x, 40)} ({type(x).__name__}); expected a number (int or float)")
    try:
        return np.array(v, np.float64)
    except OverflowError:  # an integer of more than 64 bits
        raise _bad(f"{where} holds an integer too large for a float; expected numbers of at most "
                   f"{MAX_ABS_OBS:.0e} in size") from None


@dataclass(frozen=True)
class BoxSpec:
    """A Box space as a hello describes it: a shape and per-value (or one) low and high bound."""

    shape: tuple[int, ...]
    low: np.ndarray  # float32, of ``shape``
    high: np.ndarray

    def to_gym(self):
        import gymnasium as gym

        return gym.spaces.Box(self.low, self.high, self.shape, np.float32)

    def same(self, other: BoxSpec) -> bool:
        return self.shape == other.shape and np.array_equal(self.low, other.low) \
            and np.array_equal(self.high, other.high)

    def wire(self) -> dict:
        return {"shape": list(self.shape), "low": self.low.reshape(-1).astype(float).tolist(),
                "high": self.high.reshape(-1).astype(float).tolist()}

    def describe(self) -> str:
        def b(a):
            return f"{float(a.flat[0]):g}" if a.size and (a == a.flat[0]).all() else f"[{a.size} values]"
        return f"Box(shape {list(self.shape)}, low {b(self.low)}, high {b(self.high)})"


def check_space(msg: dict, key: str, *, action: bool) -> BoxSpec:
    what = "action_space" if action else "obs_space"
    sp = _field(msg, key, f"a map {{shape, low, high}} describing the {what}")
    if not isinstance(sp, dict):
        raise _bad(f"hello.{key} is a {type(sp).__name__}; expected a map {{shape: [ints], low, high}}")
    shape = _field({**sp, "type": f"hello.{key}"}, "shape", "an array of positive integers")
    if not isinstance(shape, list) or not shape or not all(_is_int(d) and d > 0 for d in shape):
        raise _bad(f"hello.{key}.shape = {shown(shape, 80)}; expected a non-empty array of positive integers")
    if action and len(shape) != 1:
        raise _bad(f"hello.{key}.shape = {shape}; expected one dimension (sacbot's actions are a 1-D Box)")
    limit = MAX_ACTION_DIMS if action else MAX_OBS_VALUES
    n = math.prod(shape)
    if n > limit:
        raise _bad(f"hello.{key}.shape = {shape} holds {n:,} values; at most {limit:,} are accepted")
    bounds = []
    for b in ("low", "high"):
        v = _field({**sp, "type": f"hello.{key}"}, b, "a number, or an array of one number per value")
        where = f"hello.{key}.{b}"
        arr = np.full(n, float(v)) if _is_number(v) else numbers(where, v, n)
        if np.isnan(arr).any():
            raise _bad(f"{where} holds NaN; expected numbers (the observation's may be -inf/+inf)")
        if action and not np.isfinite(arr).all():
            raise _bad(f"{where} holds an infinite bound; expected finite action bounds (SAC squashes actions "
                       "into [low, high] with tanh)")
        with np.errstate(over="ignore"):
            f32 = arr.astype(np.float32)
        if action and not np.isfinite(f32).all():
            raise _bad(f"{where} holds a bound too large for float32; expected |bound| <= 3.4e38")
        bounds.append(f32.reshape(shape))
    low, high = bounds
    if not (low <= high).all() or (action and not (low < high).all()):
        i = int(np.flatnonzero(~((low < high) if action else (low <= high)))[0])
        raise _bad(f"hello.{key}: low[{i}] = {low.flat[i]:g} is not below high[{i}] = {high.flat[i]:g}; expected "
                   f"low {'<' if action else '<='} high for every value")
    if action:
        with np.errstate(over="ignore"):
            span = (high - low) / 2
        if not np.isfinite(span).all():
            raise _bad(f"hello.{key}: (high - low) overflows float32; expected a narrower action range")
    return BoxSpec(tuple(shape), low, high)


@dataclass(frozen=True)
class Hello:
    version: int
    bot: str
    obs: BoxSpec
    action: BoxSpec
    token: str | None


def check_hello(msg: dict) -> Hello:
    version = _field(msg, "version", f"the protocol version, an integer ({PROTOCOL_VERSION})")
    if not _is_int(version):
        raise _bad(f"hello.version = {shown(version, 40)}; expected an integer ({PROTOCOL_VERSION})")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"this server speaks protocol version {PROTOCOL_VERSION}, the client "
                                       f"{version}; expected version {PROTOCOL_VERSION} (docs/protocol.md)")
    bot = _field(msg, "bot", "the bot's name, a string")
    if not isinstance(bot, str) or not NAME_RE.match(bot):
        raise ProtocolError("bad_name", f"hello.bot = {shown(bot, 80)} is not accepted as a bot name; expected 1 to 64 "
                                        "letters, digits, '_' or '-', starting with a letter or digit (it names "
                                        "the bot's directory)")
    token = _field(msg, "token", "a string", required=False, allow_nil=True)
    if token is not None and (not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS):
        raise _bad(f"hello.token is a {type(token).__name__}; expected a string of at most {MAX_TOKEN_CHARS} "
                   "characters, or nil")
    return Hello(version, bot, check_space(msg, "obs_space", action=False),
                 check_space(msg, "action_space", action=True), token)


def check_new_episode(msg: dict) -> str:
    opponent = _field(msg, "opponent", "a string or an integer id", required=False, allow_nil=True)
    try:
        return check_opponent("" if opponent is None else opponent)
    except MessageError as e:
        raise _bad(f"new_episode.{e}; expected a string of at most 256 characters, an integer id, or nil") from None


@dataclass(frozen=True)
class Step:
    obs: np.ndarray  # float32, of the observation space's shape
    reward: float | None
    terminated: bool
    truncated: bool
    won: bool | None


def check_step(msg: dict, obs: BoxSpec) -> Step:
    n = math.prod(obs.shape)
    raw = numbers("step.obs", _field(msg, "obs", f"an array of {n} numbers"), n)
    try:
        x = check_vector("step.obs", raw.reshape(obs.shape), n, shape=obs.shape, max_abs=MAX_ABS_OBS)
    except MessageError as e:
        raise _bad(f"{e}; expected {n} finite numbers of at most {MAX_ABS_OBS:.0e} in size") from None
    reward = _field(msg, "reward", "a number, or nil on an episode's first step", required=False, allow_nil=True)
    if reward is not None:
        if not _is_number(reward):
            raise _bad(f"step.reward = {shown(reward, 40)} ({type(reward).__name__}); expected a number, or nil on an "
                       "episode's first step")
        try:
            reward = check_reward(reward)
        except MessageError as e:
            raise _bad(f"step.{e}; expected a finite number of at most {MAX_ABS_OBS:.0e} in size") from None
    try:
        flags = [check_flag(f"step.{k}", msg.get(k, False)) for k in ("terminated", "truncated")]
    except MessageError as e:
        raise _bad(f"{e}; expected true or false") from None
    info = _field(msg, "info", "a map or nil", required=False, allow_nil=True)
    won = None
    if info is not None:
        if not isinstance(info, dict):
            raise _bad(f"step.info is a {type(info).__name__}; expected a map (or nil)")
        w = info.get("won")
        if w is not None and not isinstance(w, bool):
            raise _bad(f"step.info.won = {shown(w, 40)}; expected a boolean (or absent)")
        won = w
    return Step(x, reward, flags[0], flags[1], won)
