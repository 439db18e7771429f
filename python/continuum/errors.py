"""The exceptions continuum raises: ``continuum.Error`` and one subclass per kind of error a
caller handles. Each carries the error's facts as attributes (``atom``, ``key``, ``run``...).
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error continuum raises."""


class InvalidArgumentError(Error, ValueError):
    """An argument or option continuum refuses (a bad delta, an invalid parent, a record
    too large, an invalid option). Nothing was written."""


class ConflictError(Error):
    """The step is already recorded (same run, agent and key on the same branch); ``atom``
    is the recorded atom. Also raised for a shared-state key read at a version another atom
    changed before the commit (``key``, ``expected``, ``found``)."""


class KeyCollisionError(ConflictError):
    """Two keys hash alike in the store's index; ``key`` cannot be stored."""


class InDoubtError(Error):
    """A guarded side effect started and its outcome was never recorded (a crash, or another
    thread running it now). Check the external system with ``key``, then call
    ``Store.resolve_guard``."""


class GuardNotInDoubtError(Error):
    """``Store.resolve_guard`` was given a ``key`` with no side effect in doubt."""


class AtomFailedError(Error):
    """The atom failed for good in an earlier attempt (``atom``, ``message``, ``retryable``)."""


class GuardFailedError(Error):
    """The guarded side effect failed for good in an earlier call (``key``, ``message``)."""


class OutputNotRecordedError(Error):
    """The step ran and its completion could not be recorded; ``result`` and ``delta`` hold
    its output so that it need not run again, ``__cause__`` says why."""


class InvalidTransitionError(Error):
    """The atom cannot go from ``from_status`` to ``to_status`` (completing it twice)."""


class RunFinishedError(Error):
    """The run has finished; it takes no new atoms."""


class RunSuspendedError(Error):
    """The run is suspended (``run``, its ``suspension`` number); it takes no new atoms until
    it is resumed."""


class StoppingError(Error):
    """The store was asked to stop (a graceful shutdown): it takes no new atoms of ``run``; an
    agent stops at this atom boundary."""


class UnknownRunError(Error, LookupError):
    """No run has this id or name (``run``)."""


class UnknownAtomError(Error, LookupError):
    """No atom has this id (``atom``)."""


class HistoryReclaimedError(Error):
    """Retention reclaimed the history needed to rebuild ``atom``."""


class CorruptionError(Error):
    """Stored bytes are damaged or inconsistent (``path`` and ``offset``, or ``lsn``)."""


class IoError(Error, OSError):
    """A file-system call failed (``path``)."""


class NoSpaceError(IoError):
    """The disk is full (``ENOSPC``). The store stays usable: retention can free space."""


class PoisonedError(Error):
    """An earlier write or sync failed: the store refuses writes until it is reopened."""


class LockedError(Error):
    """Another handle, in this process or another one, has the store at ``path`` open."""


class ClosedError(Error):
    """The store is closed."""


class ReadOnlyError(Error):
    """The store was opened with ``read_only=True``: it takes no writes."""


class LimitExceededError(Error):
    """A bound of the store was reached (atom ids, a file's size): nothing was written."""


class Failure(Exception):
    """Raise it from ``Store.execute``'s or ``Store.guarded``'s callable to choose whether the
    failure may run again: ``raise continuum.Failure("card declined", retryable=False)``
    records a failure every later call returns (``AtomFailedError``, ``GuardFailedError``).
    Any other exception is a retryable failure."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


__all__ = [
    "AtomFailedError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "Error",
    "Failure",
    "GuardFailedError",
    "GuardNotInDoubtError",
    "HistoryReclaimedError",
    "InDoubtError",
    "InvalidArgumentError",
    "InvalidTransitionError",
    "IoError",
    "KeyCollisionError",
    "LockedError",
    "NoSpaceError",
    "OutputNotRecordedError",
    "PoisonedError",
    "ReadOnlyError",
    "LimitExceededError",
    "RunFinishedError",
    "RunSuspendedError",
    "StoppingError",
    "UnknownAtomError",
    "UnknownRunError",
]
