"""The Python client of ``sacbot serve``: a game loop that gets its actions from a server.

Usage, from any game loop (the server: ``sacbot serve --root runs/serve``)::

    from sacbot.serve.client import SacbotClient, ServerError

    obs_space = {"shape": [3], "low": -1.0, "high": 1.0}            # or a gymnasium Box
    action_space = {"shape": [1], "low": [-2.0], "high": [2.0]}
    with SacbotClient("my-bot", obs_space, action_space, port=7373) as bot:
        for episode in range(100):
            bot.new_episode(opponent="tracker")
            obs, reward, terminated, truncated = game.reset(), None, False, False   # no reward before an action
            while (action := bot.step(obs, reward, terminated, truncated)) is not None:
                obs, reward, terminated, truncated = game.step(action)

``step(obs, reward, terminated, truncated)`` sends what followed the last action and returns the
next one, or None when that step ended the episode.  A game that loses the server
(``ConnectionError``) calls ``connect()`` again, which retries with backoff, and starts a new
episode: the bot goes on where the server left it.  Refusals arrive as :class:`ServerError` with
the server's ``code`` and ``message``; the server closes the connection after one.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sacbot.serve import DEFAULT_PORT, MAX_FRAME, PROTOCOL_VERSION
from sacbot.serve.protocol import FrameReader, PeerClosed, ProtocolError, decode_body, encode_frame


class ServerError(Exception):
    """The server refused a message: ``code`` (docs/protocol.md lists them) and ``message``
    (what was wrong and what is expected).  The connection is closed."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def space_wire(space: Any) -> dict:
    """A Box (gymnasium) or a mapping {shape, low, high} as the hello sends it."""
    if isinstance(space, Mapping):
        shape, low, high = space["shape"], space["low"], space["high"]
    else:
        shape, low, high = space.shape, space.low, space.high

    def bound(b):
        if isinstance(b, int | float):
            return float(b)
        return np.asarray(b, np.float64).reshape(-1).tolist()

    return {"shape": [int(d) for d in shape], "low": bound(low), "high": bound(high)}


class SacbotClient:
    """One game's connection to ``sacbot serve``, playing the bot ``bot``::

        with SacbotClient("tank-1", obs_space, action_space) as bot:          # connect() and hello
            while playing:
                bot.new_episode(opponent="tracker")
                obs, reward, terminated, truncated = game.reset(), None, False, False
                while (action := bot.step(obs, reward, terminated, truncated)) is not None:
                    obs, reward, terminated, truncated = game.step(action)

    ``host``/``port`` (TCP) or ``socket_path`` (a Unix socket); ``token``: the server's shared
    secret, if it has one.  ``timeout``: seconds a reply may take (a lockstep server's reply waits
    for training); ``hello_timeout``: the first reply may take longer, since the server starts the
    bot (its checkpoint, its learner).  ``connect_for``: how long ``connect()`` keeps retrying a
    server that is not there (yet), with backoff from ``backoff`` doubling up to ``max_backoff``."""

    def __init__(self, bot: str, obs_space: Any, action_space: Any, *, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, socket_path: str | None = None, token: str | None = None,
                 timeout: float = 60.0, hello_timeout: float = 300.0, connect_for: float = 30.0,
                 backoff: float = 0.05, max_backoff: float = 2.0, max_frame: int = MAX_FRAME):
        self.bot, self.host, self.port, self.socket_path, self.token = bot, host, port, socket_path, token
        self.obs_space, self.action_space = space_wire(obs_space), space_wire(action_space)
        self.timeout, self.hello_timeout = timeout, hello_timeout
        self.connect_for, self.backoff, self.max_backoff, self.max_frame = connect_for, backoff, max_backoff, max_frame
        self.welcome: dict | None = None
        self.last: dict | None = None  # the last reply: its tick, episode and policy_version
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None

    # --- connection ---------------------------------------------------------------------
    def connect(self) -> dict:
        """Connect (retrying for ``connect_for`` s while nobody listens) and say hello.  Returns
        the welcome: the server's version, the bot's ``ticks``, ``episodes`` and ``settings``."""
        self.disconnect()
        deadline = time.monotonic() + self.connect_for
        wait = self.backoff
        while True:
            try:
                sock = self._open()
                break
            except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, TimeoutError) as e:
                if time.monotonic() + wait > deadline:
                    raise ConnectionError(f"no sacbot server at {self._where()} after {self.connect_for:g} s "
                                          f"({type(e).__name__}: {e})") from None
                time.sleep(wait)  # backoff between attempts to reach a server that is restarting
                wait = min(wait * 2, self.max_backoff)
        self._sock, self._reader = sock, FrameReader(sock, self.max_frame)
        self.welcome = self._call({"type": "hello", "version": PROTOCOL_VERSION, "bot": self.bot,
                                   "obs_space": self.obs_space, "action_space": self.action_space,
                                   "token": self.token}, "welcome", self.hello_timeout)
        return self.welcome

    def _open(self) -> socket.socket:
        if self.socket_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small frame a tick: no Nagle delay
        return sock

    def _where(self) -> str:
        return f"unix {self.socket_path}" if self.socket_path else f"{self.host}:{self.port}"

    def disconnect(self) -> None:
        """Drop the connection without a close message (what a crashed game does)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = self._reader = None

    def _call(self, msg: dict, want: str, timeout: float | None = None) -> dict:
        if self._sock is None:
            raise ConnectionError("not connected: call connect() first")
        try:
            self._sock.settimeout(self.timeout)
            self._sock.sendall(encode_frame(msg))
            wait = self.timeout if timeout is None else timeout
            reply = decode_body(self._reader.read(idle_timeout=wait, frame_timeout=wait))
        except (PeerClosed, OSError, ProtocolError) as e:
            self.disconnect()
            raise ConnectionError(f"lost the server at {self._where()}: {e}") from None
        if reply["type"] == "error":
            self.disconnect()
            raise ServerError(str(reply.get("code")), str(reply.get("message")))
        if reply["type"] != want:
            self.disconnect()
            raise ConnectionError(f"the server answered {reply['type']!r} where {want!r} was expected")
        self.last = reply
        return reply

    # --- the game loop --------------------------------------------------------------------
    def new_episode(self, opponent: str | int = "") -> int:
        """Start an episode (``opponent``: a stable name or id); returns the bot's episode index."""
        return int(self._call({"type": "new_episode", "opponent": opponent}, "ok")["episode"])

    def step(self, obs: Sequence[float] | np.ndarray, reward: float | None = None, terminated: bool = False,
             truncated: bool = False, info: Mapping[str, Any] | None = None) -> np.ndarray | None:
        """Send this tick's observation (and the reward, flags and ``info`` of the last action; on
        an episode's first step reward is None) and return the action, a float64 array, or None
        when this step ended the episode.  ``info`` may carry a boolean ``won``."""
        values = np.asarray(obs, np.float64).reshape(-1)
        if reward is not None:
            reward = float(reward)  # NaN is sent as is: the server refuses it and says why
        msg = {"type": "step", "obs": values.tolist(), "reward": reward, "terminated": bool(terminated),
               "truncated": bool(truncated)}
        if info is not None:
            msg["info"] = dict(info)
        reply = self._call(msg, "action")
        return None if reply["action"] is None else np.asarray(reply["action"], np.float64)

    def close(self) -> None:
        """Say goodbye and close.  The bot stays loaded on the server (its final save comes when the
        server stops); an episode in progress ends there, as truncated."""
        if self._sock is None:
            return
        try:
            self._call({"type": "close"}, "bye")
        except (ConnectionError, ServerError):
            pass
        finally:
            self.disconnect()

    def __enter__(self) -> SacbotClient:
        if self._sock is None:
            self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
