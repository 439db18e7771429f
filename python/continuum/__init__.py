"""continuum: an embedded, crash-safe, append-only log store for long-running AI agents.

Every unit of agent work (an *atom*) is written to a write-ahead log before anything uses it;
after a crash, ``Store.execute`` returns recorded outputs instead of running a completed step
again, and ``Store.guarded`` runs a side effect at most once per idempotency key::

    import continuum

    with continuum.Store("/var/lib/my-agent/store") as store:
        run = store.create_run("trip-42")
        plan = store.execute(run, "planner", "step-1", [], lambda atom: b"plan")
        pnr = store.guarded(plan.atom, "book_flight", lambda key: b"PNR 7XK2")
"""

from continuum._continuum import Atom, Executed, History, Store
from continuum.errors import (
    AtomFailedError,
    ClosedError,
    ConflictError,
    CorruptionError,
    Error,
    Failure,
    GuardFailedError,
    GuardNotInDoubtError,
    HistoryReclaimedError,
    InDoubtError,
    InvalidArgumentError,
    InvalidTransitionError,
    IoError,
    KeyCollisionError,
    LockedError,
    NoSpaceError,
    OutputNotRecordedError,
    PoisonedError,
    ReadOnlyError,
    LimitExceededError,
    RunFinishedError,
    RunSuspendedError,
    StoppingError,
    UnknownAtomError,
    UnknownRunError,
)

__all__ = [
    "Atom",
    "AtomFailedError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "Error",
    "Executed",
    "Failure",
    "GuardFailedError",
    "GuardNotInDoubtError",
    "History",
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
    "Store",
    "UnknownAtomError",
    "UnknownRunError",
]
