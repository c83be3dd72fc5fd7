"""What can go wrong with a checkpoint, as exception classes (see :mod:`sacbot.store.checkpoint`)."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint file cannot be used; the message says why."""


class CheckpointMismatch(CheckpointError):
    """A sound checkpoint of a bot with other settings (env spaces, network size, quantization)
    than this run's.  Not the file's fault: it is never set aside, and loading stops."""


class NonFiniteState(CheckpointError):
    """``write_checkpoint`` refused a payload whose arrays hold NaN or inf; nothing was written."""


class CheckpointStop(CheckpointError):
    """The file is not proven bad, but this run cannot use it now.  Never set aside: loading stops
    and every file stays where it was; the message says what to do."""


class CheckpointTooNew(CheckpointStop):
    """Written by a newer sacbot (a higher ``format_version``): upgrade sacbot to read it."""


class CheckpointUnreadable(CheckpointStop):
    """The system will not give us the file's bytes (permissions, I/O error, too many open files,
    no memory, not a regular file, gone while read): the bytes may be sound."""


class NewerStepFiles(CheckpointStop):
    """Step files of this bot are newer than its newest checkpoint (a rollback, or a crash of a sacbot
    that wrote the step file first): training on would write over or rotate away one of the two."""
