"""The bots a server holds: one :class:`~sacbot.acting.agent.Agent` per bot name, kept across connections.

Each bot lives under ``ROOT/<name>/``: ``weights/`` (its checkpoints, lock and round counter) and
``run/`` (its status.json, episodes and training metrics), with a Config derived from the
server's, so a bot served here is the same bot ``sacbot run --weights-path ROOT/<name>/weights``
would resume.  A bot stays loaded after its game disconnects, until the server stops: a game that
comes back under the same name continues it (its tick counter, recurrent learner and replay go
on).  One connection plays a bot at a time; the registry's lock guards who holds which.

    reg = BotRegistry(cfg, root, stop, max_bots=32)
    bot, how = reg.claim(hello, peer)     # ProtocolError if refused (name in use, other spaces, ...)
    ... bot.agent.act(obs) ...            # only the claiming connection's thread calls the Agent
    reg.release(bot, cut=True)            # at disconnect
    reg.close_all()                       # at stop: every bot's final save
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import zlib

from sacbot.config import MAX_SEED, Config, ConfigError
from sacbot.serve.protocol import BoxSpec, Hello, ProtocolError

log = logging.getLogger("sacbot")


class _BotLog(logging.LoggerAdapter):
    """The server's log, each line naming the bot it is about."""

    def process(self, msg, kwargs):
        return f"bot {self.extra['bot']}: {msg}", kwargs


def bot_config(cfg: Config, root: str, name: str, shared: bool = False) -> Config:
    """The server's Config for bot ``name``: its own directories, and a seed of its own (bots of one
    server would otherwise start with the same weights and draw the same exploration noise).  An
    eval on a shared learner plays the shared bot (ROOT/_shared/weights)."""
    from sacbot.serve.shared import SHARED_DIR

    weights = os.path.join(root, SHARED_DIR if shared and cfg.eval_mode else name, "weights")
    return dataclasses.replace(cfg, weights_path=weights, run_dir=os.path.join(root, name, "run"), quiet=True,
                               seed=(cfg.seed + zlib.crc32(name.encode())) % (MAX_SEED + 1))


def follow_saved_bot(cfg: Config, given: frozenset[str] | None, say) -> Config:
    """``cfg`` going on with the bot saved in its weights directory (sacbot.store.load's
    ``follow_saved_bot``), what followed it said through ``say``."""
    from sacbot.store.load import follow_saved_bot as follow

    cfg, said, _ = follow(cfg, given)
    if said:
        say(f"going on with {said}")
    return cfg


@dataclasses.dataclass
class Bot:
    name: str
    obs: BoxSpec
    action: BoxSpec
    cfg: Config
    agent: object | None = None  # a sacbot.acting.agent.Agent, once started
    peer: str | None = None  # who plays it now (None: no connection)
    connections: int = 0
    disconnects: int = 0
    episodes_cut: int = 0  # episodes whose game went away before the episode ended
    holds: int = 0  # replies held for the learner (--hold-ms), and how many of them ran out of time
    holds_out: int = 0
    learner_failed: str | None = None
    final: dict | None = None  # Agent.close()'s status, after the server's stop

    def summary(self) -> dict:
        out = {"connected": self.peer is not None, "peer": self.peer, "connections": self.connections,
               "disconnects": self.disconnects, "episodes_cut": self.episodes_cut, "holds": self.holds,
               "holds_out": self.holds_out,
               "obs_space": self.obs.describe(), "action_space": self.action.describe(),
               "weights": self.cfg.weights_path, "run_dir": self.cfg.run_dir}
        agent = self.agent
        if agent is None:
            return {**out, "starting": True}
        st = self.final if self.final is not None else agent.status()
        for k in ("ticks", "episodes", "policy_version", "round_counter", "loaded_from", "learner", "learner_pid",
                  "learner_steps", "env_steps_received", "buffer_size", "last_save", "learner_error", "final_save",
                  "drops"):
            if k in st:
                out[k] = st[k]
        out["episode_index"] = agent.episode_index
        if self.learner_failed:
            out["learner_error"] = self.learner_failed
        return out


class BotRegistry:
    def __init__(self, cfg: Config, root: str, stop: threading.Event, max_bots: int = 32, shared=None,
                 given: frozenset[str] | None = None):
        """``shared``: a :class:`sacbot.serve.shared.SharedLearner` every bot feeds (``--shared-learner``);
        None: each bot has a learner of its own.  ``given``: the settings the user gave; the other
        settings that shape a bot's networks follow each saved bot (None: none follow)."""
        self.cfg, self.root, self.stop, self.max_bots, self.shared = cfg, root, stop, max_bots, shared
        self.given = given
        self._bots: dict[str, Bot] = {}
        self._lock = threading.Lock()
        self.learner_failures = 0

    def bots(self) -> list[Bot]:
        with self._lock:
            return list(self._bots.values())

    def get(self, name: str) -> Bot | None:
        with self._lock:
            return self._bots.get(name)

    def claim(self, hello: Hello, peer: str) -> tuple[Bot, str]:
        """The bot ``hello`` names, held for the connection from ``peer``; started (resumed from
        its newest checkpoint, or fresh) if it is not loaded.  Returns it and how it was found."""
        with self._lock:
            bot = self._bots.get(hello.bot)
            if bot is not None and bot.peer is not None:
                raise ProtocolError("name_in_use", f"bot {hello.bot!r} is already played by the connection from "
                                                   f"{bot.peer}; expected one game per bot name (a game that has "
                                                   "just disconnected is released within a moment: retry then)")
            if bot is not None and not (bot.obs.same(hello.obs) and bot.action.same(hello.action)):
                raise ProtocolError("spaces_mismatch", f"bot {hello.bot!r} plays obs {bot.obs.describe()} and "
                                                       f"action {bot.action.describe()}; this hello gives obs "
                                                       f"{hello.obs.describe()} and action "
                                                       f"{hello.action.describe()}; expected the same spaces "
                                                       "(another game needs another bot name)")
            if bot is None:
                if len(self._bots) >= self.max_bots:
                    raise ProtocolError("too_many_bots", f"this server holds {len(self._bots)} bots, its limit "
                                                         f"(--max-bots {self.max_bots}); expected the name of a "
                                                         "bot it holds, or a server with room")
                bot = Bot(hello.bot, hello.obs, hello.action, bot_config(self.cfg, self.root, hello.bot,
                                                                         shared=self.shared is not None))
                self._bots[hello.bot] = bot
                new = True
            else:
                new = False
            bot.peer = peer
            bot.connections += 1
        if not new:
            return bot, f"continuing at tick {bot.agent.ticks}"
        try:
            bot.agent = self._start(bot)
        except BaseException:
            with self._lock:
                del self._bots[bot.name]
            raise
        how = f"resumed from {bot.agent.loaded_from}" if bot.agent.loaded_from else "a new bot"
        return bot, how

    def _start(self, bot: Bot):
        from sacbot.acting.agent import AgentError, AgentInterrupted
        from sacbot.assembly.bot import Agent
        from sacbot.store.weights_dir import candidates
        cfg = bot.cfg
        if cfg.eval_mode and not candidates(cfg.weights_dir, cfg.latest_name):
            raise ProtocolError("bot_unavailable", f"bot {bot.name!r} has no checkpoint in {cfg.weights_dir!r} to "
                                                   "evaluate; expected a bot this server (without --eval) has "
                                                   "trained, or another name")

        if self.shared is None:  # with a shared learner the server's config already follows the shared bot
            try:  # outside the registry's lock: it reads the bot's newest checkpoint
                cfg = bot.cfg = follow_saved_bot(cfg, self.given, _BotLog(log, {"bot": bot.name}).info)
            except ConfigError as e:
                raise ProtocolError("bot_refused", f"bot {bot.name!r} cannot start: {e}; expected a bot this sacbot "
                                                   "can resume, or another bot name") from None
        # A shared learner's handle for this bot (the learner starts with the first bot); else the
        # Agent assembles a learner of its own.
        link = self.shared.link(bot.name, bot.obs, bot.action) if self.shared is not None and not cfg.eval_mode \
            else None
        try:
            return Agent(cfg, bot.obs.to_gym(), bot.action.to_gym(), logger=_BotLog(log, {"bot": bot.name}),
                         learner=link, stop=self.stop)
        except AgentInterrupted:
            raise ProtocolError("server_stopping", "the server stopped while the bot was starting; expected a "
                                                   "reconnect once it is back") from None
        except ConfigError as e:  # a saved bot of other settings or spaces, a run directory in use, memory
            raise ProtocolError("bot_refused", f"bot {bot.name!r} cannot start with these spaces and the server's "
                                               f"settings: {e}; expected the spaces and settings the bot was saved "
                                               "with (sacbot inspect shows them), or another bot name") from None
        except AgentError as e:  # its weights directory held by another process, an unreadable checkpoint
            raise ProtocolError("bot_unavailable", f"bot {bot.name!r} cannot start: {e}; expected a retry once "
                                                   "that is mended (the server serves its other bots meanwhile)") \
                from None

    def release(self, bot: Bot, cut: bool) -> None:
        """The connection playing ``bot`` ended; ``cut``: in the middle of an episode."""
        with self._lock:
            bot.peer = None
            bot.disconnects += 1
            bot.episodes_cut += int(cut)

    def retire(self, bot: Bot, why: str) -> None:
        """A bot whose learner failed: closed as ``sacbot run`` closes one (a final save if the learner's
        state allows it; a non-finite one never saves) and forgotten, so that the next hello for it
        starts it again, with a new learner, from its newest checkpoint that verifies."""
        self.learner_failures += 1
        bot.learner_failed = why
        try:
            bot.final = bot.agent.close()
        except Exception as e:  # noqa: BLE001 - the server goes on serving the other bots
            log.error("bot %s: closing after its learner failed: %s: %s", bot.name, type(e).__name__, e)
        with self._lock:
            if self._bots.get(bot.name) is bot:
                del self._bots[bot.name]

    def close_all(self, timeout: float) -> list[Bot]:
        """Every loaded bot's close (its final save), in parallel; each bounded by ``timeout``."""
        bots = [b for b in self.bots() if b.agent is not None]

        def close(bot: Bot) -> None:
            try:
                bot.final = bot.agent.close(deadline=timeout)
            except Exception as e:  # noqa: BLE001 - one bot's failure must not cost the others their save
                bot.final = {"final_save": {"ok": False, "error": f"{type(e).__name__}: {e}"}}

        threads = [threading.Thread(target=close, args=(b,), name=f"sacbot-serve-close-{b.name}", daemon=True)
                   for b in bots]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout + 30  # Agent.close bounds itself; this only guards a hang
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for b in bots:
            if b.final is None:
                b.final = {"final_save": {"ok": False, "timed_out": True, "error": "the close did not return"}}
        return bots
