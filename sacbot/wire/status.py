"""What a learner says of itself: :class:`LearnerStatus`, a typed record pushed to the acting side.

    st = learner.status()                       # the LearnerStatus the learner last pushed
    if not st.learner_alive: ...                # a field, not a key: a misspelt one fails at once
    link.push_status(st)                        # learner side: the whole record after each pass
    link.push_status({"learner_alive": False})  # a host's partial word (a child that died): merged
    st.to_dict()                                # plain data: status.json, msgpack, a Ray reply

It crosses a pipe or Ray as ``to_dict()`` and comes back through ``from_dict``.  Keys no field
names (the cluster's learner adds its ingest figures: ``transitions_received``, ``replay_ratio``,
...) are kept in ``extra``, so a newer learner's word is not lost on an older reader.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LearnerStatus:
    """A learner's word on itself, computed from its own objects; frozen: ``but()`` makes a
    changed copy.  The fields' comments say what each means."""

    learner_alive: bool = True  # False: failed to start, died, or closed
    learner_error: str | None = None  # why it died (its training failed); None while well
    processed: int = 0  # transitions whose pass has completed (the learner and lockstep paces)
    learner_pid: int | None = None
    policy_version_published: int = 0
    last_error: str | None = None  # the newest error, a failed save included
    last_save: dict | None = None  # {"path", "step", "time"} of the newest confirmed save
    saves: int = 0
    save_errors: int = 0
    torch_threads: int = 0  # as measured, not as configured
    learner_nice: int | None = None  # likewise
    grad_steps_per_s: float = 0.0
    learner_steps: int = 0  # gradient steps, cumulative over resumes
    env_steps_received: int = 0  # transitions the learner has taken in, cumulative
    buffer_size: int = 0
    quant_phase: str | None = None
    save_drops: int = 0  # periodic saves skipped because the writer was busy
    device: str | None = None
    losses: dict = field(default_factory=dict)
    final_save: dict | None = None  # {"ok": True, "path"} or {"ok": False, "error"} once closed
    start_error: str | None = None  # why it never started
    start_error_kind: str | None = None  # "config" (exit 2) or "other" (exit 1)
    closed: bool = False  # its last word was said
    extra: dict = field(default_factory=dict)  # keys no field names (a host's own figures)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ``extra``'s keys beside the fields'."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**self.extra, **d}

    @classmethod
    def from_dict(cls, d: dict) -> LearnerStatus:
        """The record ``to_dict()`` gave (from a pipe or Ray); unknown keys go into ``extra``."""
        return cls().but(**d)

    def but(self, **changes: Any) -> LearnerStatus:
        """This record with ``changes`` laid over: fields replaced, other keys into ``extra``."""
        known = {k: v for k, v in changes.items() if k in _FIELDS}
        other = {k: v for k, v in changes.items() if k not in _FIELDS}
        if "extra" in changes:
            raise TypeError("LearnerStatus.but() takes the keys themselves, not an 'extra' dict")
        return dataclasses.replace(self, **known, extra={**self.extra, **other} if other else self.extra)


_FIELDS = frozenset(f.name for f in dataclasses.fields(LearnerStatus)) - {"extra"}
