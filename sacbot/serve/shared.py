"""One learner for every bot of a server: ``sacbot serve --shared-learner``.

By default each bot a server holds has a learner of its own.  With ``--shared-learner`` the
server starts one learner, at the first bot's hello (whose spaces it then requires of every bot),
and each bot feeds it as a *source*, as a cluster's bots feed the Ray learner: one replay in
which no sequence crosses two bots, one policy that every bot plays and improves, one checkpoint
in ``ROOT/_shared/weights`` (a directory no bot name can take: names start with a letter or digit).
Each bot keeps its own ``ROOT/<name>/run`` (status, episodes) and round counter.

    shared = SharedLearner(cfg, root, stop)
    link = shared.link("tank-7", obs, action)     # a per-bot handle; ProtocolError if the spaces differ
    agent = Agent(bot_cfg, obs_space, action_space, learner=link)
    ...
    agent.close()                                 # detaches the bot; the learner goes on
    shared.close(timeout)                         # at the server's stop: the final save

Which to use: a learner per bot when the bots must stay apart (different games behind one
server, an opponent each bot must learn alone, bots to compare); one shared learner when many
instances of one game should train one policy: every bot's experience improves every bot, and
the CPU trains one network instead of N.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading

from sacbot.config import Config
from sacbot.serve.protocol import BoxSpec, ProtocolError
from sacbot.store.atomic import atomic_write_bytes
from sacbot.wire.boundary import LearnerLink, Start
from sacbot.wire.channels import is_gap_marker, transitions_in
from sacbot.wire.messages import Message
from sacbot.wire.snapshot import SnapshotReader
from sacbot.wire.status import LearnerStatus

log = logging.getLogger("sacbot")
SHARED_DIR = "_shared"


class SourceLink(LearnerLink):
    """One bot's handle on the shared learner: its messages go in tagged with its source, it pulls
    the shared actor through a reader of its own, and its close detaches it alone."""

    def __init__(self, shared: LearnerLink, source: int, spaces: tuple[int, int]):
        self.shared, self.source, self._spaces = shared, source, spaces
        self.snapshot = shared.snapshot
        self._reader = SnapshotReader(shared.snapshot)
        self._cond = shared._cond  # status waits wake with the shared learner's pushes
        self._drops = {"transition": 0, "other": 0}
        self._detached = False

    @property
    def _status(self) -> LearnerStatus:  # wait_for reads the shared learner's record
        return self.shared.status()

    def send(self, msgs: list[Message]) -> int:
        """Queue this bot's messages on the shared learner's queue, tagged with its source; never blocks."""
        if self._detached:
            return 0
        ok = 0
        for m in msgs:
            if self.shared.outbox.send((self.source, m)):
                ok += 1
            elif not is_gap_marker(m):  # a refused marker holds no data: the Agent counts its transition
                self._drops["transition" if transitions_in(m) else "other"] += max(transitions_in(m), 1)
        return ok

    def drops(self) -> dict[str, int]:
        """This bot's messages the shared queue had no room for."""
        return dict(self._drops)

    def status(self) -> LearnerStatus:
        """The shared learner's status."""
        return self.shared.status()

    def spaces(self) -> tuple[int, int]:
        return self._spaces

    def wait_processed(self, n: int, timeout: float, stop: threading.Event | None = None) -> bool:
        return False  # lockstep needs a learner of one's own; --shared-learner refuses it up front

    def wait_caught_up(self, sent: int, slack: int, timeout: float, stop: threading.Event | None = None) -> bool:
        return True  # a game's own loop is never paced

    def close(self, acting_rng: str | None = None, timeout: float = 60.0) -> LearnerStatus:
        """Detach this bot; the shared learner goes on and makes its own final save at the server's stop."""
        self._detached = True
        return self.status().but(final_save={"ok": True, "by": "the server's shared learner"})

    def abort(self, timeout: float) -> bool:
        self._detached = True
        return True


def shared_weights(root: str) -> str:
    """The shared bot's weights directory under the server's ``root``."""
    return os.path.join(root, SHARED_DIR, "weights")


class SharedLearner:
    """The server's one learner, started by the first bot that needs it."""

    def __init__(self, cfg: Config, root: str, stop: threading.Event):
        self.dir = os.path.join(root, SHARED_DIR)
        self.cfg = dataclasses.replace(cfg, weights_path=shared_weights(root),
                                       run_dir=os.path.join(self.dir, "run"), quiet=True)
        self.stop = stop
        self.start: Start | None = None
        self.obs: BoxSpec | None = None
        self.action: BoxSpec | None = None
        self._lock = threading.Lock()
        self._sources_path = os.path.join(self.dir, "sources.json")
        self._sources: dict[str, int] = {}
        self.final: LearnerStatus | None = None

    def link(self, name: str, obs: BoxSpec, action: BoxSpec) -> SourceLink:
        """A handle for bot ``name``; the learner starts here if it has not (ProtocolError if it
        cannot, or if these spaces are not the ones it learns)."""
        with self._lock:
            if self.start is None:
                self._begin(obs, action)
            elif not (self.obs.same(obs) and self.action.same(action)):
                raise ProtocolError("spaces_mismatch", f"this server's shared learner learns obs {self.obs.describe()} "
                                                       f"and action {self.action.describe()}; bot {name!r} gives obs "
                                                       f"{obs.describe()} and action {action.describe()}; expected "
                                                       "the same spaces (another game needs another server, or no "
                                                       "--shared-learner)")
            assert self.start is not None and self.start.learner is not None
            failed = self.start.learner.status().learner_error
            if failed:
                raise ProtocolError("bot_unavailable", f"the server's shared learner failed ({failed}); expected a "
                                                       "restart of the server, which resumes from its newest "
                                                       "checkpoint")
            return SourceLink(self.start.learner, self._source(name), self._dims)

    def _begin(self, obs: BoxSpec, action: BoxSpec) -> None:
        from sacbot.acting.errors import AgentError
        from sacbot.acting.spaces import input_dim, learner_spaces, space_dims
        from sacbot.assembly.assemble import assemble
        from sacbot.config import ConfigError
        from sacbot.wire.boundary import StartError, StartInterrupted

        os.makedirs(self.cfg.run_dir, exist_ok=True)
        os.makedirs(self.cfg.weights_dir, exist_ok=True)
        self._sources = self._read_sources()
        obs_space, action_space = obs.to_gym(), action.to_gym()
        try:
            obs_dim, act_dim = space_dims(obs_space, action_space)
            net_obs = input_dim(self.cfg, obs_dim)
            self.start = assemble(self.cfg, net_obs, act_dim, learner_spaces(net_obs, obs_space, action_space),
                                  log, stop=self.stop)
        except StartInterrupted:
            raise ProtocolError("server_stopping", "the server stopped while its shared learner was starting; "
                                                   "expected a reconnect once it is back") from None
        except (ConfigError, StartError, AgentError) as e:
            raise ProtocolError("bot_unavailable", f"the server's shared learner cannot start: {e}; expected a "
                                                   "retry once that is mended") from None
        self.obs, self.action, self._dims = obs, action, (net_obs, act_dim)
        how = f"resumed from {self.start.loaded_from}" if self.start.loaded_from else "fresh"
        log.info("serve: the shared learner started (%s) in %s", how, self.cfg.weights_dir)

    def _read_sources(self) -> dict[str, int]:
        """Bot name -> source id, kept across restarts so a bot's rows in the saved replay stay its own."""
        try:
            with open(self._sources_path) as fh:
                got = json.load(fh)
            if isinstance(got, dict) and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in got.items()):
                return got
            log.warning("serve: %s is not a name -> source map; numbering the bots afresh", self._sources_path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("serve: %s cannot be read (%s); numbering the bots afresh", self._sources_path, e)
        return {}

    def _source(self, name: str) -> int:
        if name not in self._sources:
            self._sources[name] = max(self._sources.values(), default=-1) + 1
            try:
                atomic_write_bytes(self._sources_path, json.dumps(self._sources, indent=1).encode())
            except OSError as e:  # the bot still plays; a restart may number it otherwise
                log.warning("serve: %s cannot be written: %s", self._sources_path, e.strerror or e)
        return self._sources[name]

    def status(self) -> dict | None:
        """The shared learner's status for the server's status.json; None before it starts."""
        if self.start is None or self.start.learner is None:
            return None
        st = (self.final or self.start.learner.status()).to_dict()
        return {"weights": self.cfg.weights_dir, "sources": dict(self._sources),
                **{k: st.get(k) for k in ("learner_alive", "learner_error", "learner_steps", "env_steps_received",
                                          "buffer_size", "last_save", "final_save", "policy_version_published")}}

    def close(self, timeout: float) -> LearnerStatus | None:
        """The final save, after every bot has detached; None if it never started."""
        if self.start is None or self.start.learner is None:
            return None
        try:
            self.final = self.start.learner.close(timeout=timeout)
        finally:
            self.start.release()
        return self.final
