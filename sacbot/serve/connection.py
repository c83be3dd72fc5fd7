"""One game's connection to the server: hello, then episodes of steps, until close, an error or a stop.

A Connection does no I/O of its own: the server's loop (:mod:`sacbot.serve.server`) reads its
frames and hands each message to :meth:`Connection.process`, which returns the frames to send back.
What the game sends is checked by :mod:`sacbot.serve.protocol` first; a refusal goes back as an
error frame and ends the connection, never the server.  How a step maps onto the Agent
(docs/protocol.md): an episode's first step is ``act(obs)``; every later one is
``observe(reward, obs, terminated, truncated, info)`` for the last action, then ``act(obs)``
unless the episode ended, as the Agent's docstring orders them.

One thread at a time calls a Connection, and the same one for a bot's every act/observe (the
Agent refuses others): the loop, or, where a step may wait (``--pace lockstep``, ``--hold-ms``),
the connection's own thread.
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING

from sacbot import __version__
from sacbot.serve import protocol as p
from sacbot.serve.bots import Bot
from sacbot.wire.messages import MessageError, shown

if TYPE_CHECKING:
    from sacbot.serve.server import Server

log = logging.getLogger("sacbot")
# Settings a client may want to know (they shape what the bot does); sent in the welcome.
WELCOME_SETTINGS = ("env", "eval_mode", "learner", "pace", "hidden", "utd_ratio", "learning_starts", "reward_input",
                    "reward_input_squash", "memoryless", "quant", "seed", "opponent_policy")


class NeedsThread(Exception):
    """Raised before anything is done: this message may take long (a bot to close), and the
    caller, the server's loop, is serving other games; run it on a thread of its own instead."""


class Connection:
    """One game's connection: hello, then episodes of steps, until close, an error or a stop.

        conn = Connection(server, peer)
        keep = conn.process(msg)     # the replies are in conn.outbox; False: close after sending them
    """

    def __init__(self, server: Server, peer: str):
        self.server, self.peer = server, peer
        self.opts = server.opts
        self.outbox: list[bytes] = []  # frames to send, in order; the caller takes them
        self.on_loop = True  # called by the server's loop (which must never wait), or by a thread of its own
        self.bot: Bot | None = None
        self.in_episode = False  # between new_episode and the step that ends it
        self.first_step = False  # the episode's next step is its first (no reward yet)

    def send(self, msg: dict) -> None:
        self.outbox.append(p.encode_frame(msg))

    def process(self, msg: dict) -> bool:
        """Handle one message; its replies go to ``outbox``.  False: the connection ends once they
        are sent (a close, or a refusal: an error frame).  NeedsThread propagates."""
        try:
            return self.handle(msg)
        except p.ProtocolError as e:
            self.fail(e)
        except NeedsThread:
            raise
        except Exception as e:  # noqa: BLE001 - a fault of ours ends this connection, never the server
            log.exception("serve: %s: internal error", self.peer)
            self.fail(p.ProtocolError("internal", f"the server failed on this message ({type(e).__name__}: {e}); "
                                                  "this is a bug in sacbot, please report it"), quiet=True)
        return False

    def fail(self, e: p.ProtocolError, quiet: bool = False) -> None:
        """End the connection with ``e``'s error frame (after giving the bot up, so that a client
        which reconnects at once finds its bot free)."""
        if not quiet and e.code != "server_stopping":  # every connection gets that one: the stop is logged once
            log.info("serve: %s%s: %s", self.peer, f" (bot {self.bot.name})" if self.bot else "", e)
        self.end()
        self.send(e.frame())

    def end(self) -> None:
        """Give the bot up (once): the connection is over, or about to be."""
        bot, self.bot = self.bot, None
        if bot is None:
            return
        cut, self.in_episode = self.in_episode, False
        if bot.learner_failed is None:
            self.server.registry.release(bot, cut)
        if cut:
            # Nothing is made up: the transitions already sent stay, and the step whose outcome never
            # came is not recorded.  The learner bootstraps the episode's last stored step, as for a
            # truncation; the bot's next new_episode starts cleanly.
            log.info("serve: bot %s: its connection ended in the middle of episode %d (tick %d); the episode ends "
                     "there, as truncated", bot.name, bot.agent.episode_index - 1, bot.agent.ticks)
        log.info("serve: bot %s: disconnected (%s)", bot.name, self.peer)

    def handle(self, msg: dict) -> bool:
        kind = msg["type"]
        if kind == "step":
            self.step(msg)
        elif kind == "new_episode":
            self.new_episode(msg)
        elif kind == "hello":
            self.hello(msg)
        elif kind == "close":
            self.end()  # before the reply, as for an error
            self.send({"type": "bye"})
            return False
        else:
            raise p.ProtocolError("unknown_type", f"unknown message type {shown(kind)}; expected one of hello, "
                                                  "new_episode, step, close")
        return True

    def hello(self, msg: dict) -> None:
        if self.bot is not None:
            raise p.ProtocolError("hello_again", f"a second hello on this connection, which plays bot "
                                                 f"{self.bot.name!r}; expected one hello per connection (open "
                                                 "another connection to play another bot or other spaces)")
        if self.on_loop:
            raise NeedsThread  # loading a bot (and starting its learner) takes seconds
        h = p.check_hello(msg)
        if self.opts.token is not None and (
                h.token is None or not hmac.compare_digest(h.token.encode(), self.opts.token.encode())):
            raise p.ProtocolError("auth", "this server requires a token, and hello.token is "
                                          + ("missing" if h.token is None else "wrong")
                                          + "; expected the server's --token (or SACBOT_SERVE_TOKEN)")
        bot, how = self.server.registry.claim(h, self.peer)
        self.bot = bot
        agent = bot.agent
        log.info("serve: bot %s: connected from %s (%s)", bot.name, self.peer, how)
        cfg = self.server.cfg
        self.send({"type": "welcome", "version": p.PROTOCOL_VERSION, "server": f"sacbot {__version__}",
                   "bot": bot.name, "mode": "eval" if cfg.eval_mode else "train", "resumed_from": agent.loaded_from,
                   "ticks": agent.ticks, "episodes": agent.episode_index, "policy_version": agent.policy_version,
                   "settings": {k: getattr(bot.cfg, k) for k in WELCOME_SETTINGS},
                   "weights": bot.cfg.weights_path, "run_dir": bot.cfg.run_dir,
                   "max_frame": self.opts.max_frame, "idle_timeout": self.opts.idle_timeout,
                   "frame_timeout": self.opts.frame_timeout})

    def _ready(self, what: str) -> Bot:
        if self.bot is None:
            raise p.ProtocolError("not_ready", f"{what} before hello; expected hello first")
        return self.bot

    def new_episode(self, msg: dict) -> None:
        bot = self._ready("new_episode")
        opponent = p.check_new_episode(msg)
        bot.agent.new_episode(opponent)  # claims the Agent for this thread: a reconnect gets it back
        self.in_episode, self.first_step = True, True
        self.send({"type": "ok", "episode": bot.agent.episode_index - 1})

    def _hold(self, bot: Bot) -> None:
        """--hold-ms: while the learner is over half a queue behind, hold this reply (a bounded time), so
        that a game which waits for its bot plays at the learner's pace and none of its steps is dropped."""
        hold = self.server.opts.hold_ms
        if hold <= 0 or self.server.cfg.pace != "learner" or bot.agent.learner is None:
            return
        bot.holds += 1
        if not bot.agent.keep_up(timeout=hold / 1000.0):
            bot.holds_out += 1

    def step(self, msg: dict) -> None:
        bot = self._ready("step")
        if not self.in_episode:
            raise p.ProtocolError("not_ready", "step outside an episode; expected new_episode before an episode's "
                                               "first step (and after a step that ended the last one)")
        agent = bot.agent
        err = agent.learner_error
        if err is not None:
            if self.on_loop:
                raise NeedsThread  # retiring the bot closes it: a final save
            self.in_episode = False
            self.server.registry.retire(bot, err)
            raise p.ProtocolError("learner_failed", f"bot {bot.name!r}'s learner failed ({err}); the bot was "
                                                    "closed; expected a new hello, which starts it again from its "
                                                    "newest checkpoint with a new learner")
        s = p.check_step(msg, bot.obs)
        try:
            if self.first_step:
                if s.reward is not None or s.terminated or s.truncated:
                    raise p.ProtocolError("bad_message", "this is the first step of an episode, which no action "
                                                         f"preceded: got reward {s.reward!r}, terminated "
                                                         f"{s.terminated}, truncated {s.truncated}; expected reward "
                                                         "nil and terminated = truncated = false")
                self.first_step = False
            else:
                if s.reward is None:
                    raise p.ProtocolError("bad_message", "step.reward is nil, but this is not the episode's first "
                                                         "step; expected the reward the last action earned")
                agent.observe(s.reward, s.obs, s.terminated, s.truncated,
                              None if s.won is None else {"won": s.won})
                if s.terminated or s.truncated:
                    self.in_episode = False
                    self.send({"type": "action", "action": None, "done": True, "tick": agent.ticks,
                               "episode": agent.episode_index - 1, "policy_version": agent.policy_version})
                    return
                self._hold(bot)
            action = agent.act(s.obs)
        except MessageError as e:  # the Agent's own checks: a value the protocol's checks let through
            raise p.ProtocolError("bad_message", f"{e}; expected values the bot's spaces allow") from None
        self.send({"type": "action", "action": action.astype(float).tolist(), "done": False, "tick": agent.ticks,
                   "episode": agent.episode_index - 1, "policy_version": agent.policy_version})
