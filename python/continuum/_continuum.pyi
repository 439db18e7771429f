"""Type stubs of the extension module ``continuum._continuum`` (import ``continuum``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
import pathlib
from os import PathLike
from typing import Any, Literal, Optional, TypedDict, Union

class ToolCall(TypedDict):
    id: str
    name: str
    arguments: str

class _MessageBase(TypedDict):
    role: str
    content: str

class Message(_MessageBase, total=False):
    tool_call: ToolCall

Summarization = TypedDict("Summarization", {"from": int, "to": int, "role": str, "summary": str})

class Delta(TypedDict, total=False):
    """What an atom changed. ``state`` maps a key to its new bytes, or None to delete it."""

    messages: list[Message]
    tool_outputs: dict[str, bytes]
    intermediate_results: dict[str, bytes]
    state: dict[str, Optional[bytes]]
    drop_oldest_messages: int
    summarizations: list[Summarization]

class Context(TypedDict):
    """The fold of an agent's deltas along its atom DAG."""

    messages: list[Message]
    tool_outputs: dict[str, bytes]
    intermediate_results: dict[str, bytes]
    state: dict[str, bytes]

class RunStatus(TypedDict, total=False):
    status: Literal["running", "suspended", "finished", "dropped"]
    success: bool
    resume_hint: str
    reason: Literal["approval", "timer", "budget", "requested", "deadline"]
    since_unix_us: int
    resume_at_unix_us: int
    what: str
    by: str
    at_unix_us: int

class RunInfo(TypedDict):
    id: int
    name: str
    status: RunStatus

class AgentResume(TypedDict):
    agent: str
    completed: list[int]
    last_completed: Optional[int]
    first_incomplete: Optional[int]
    failed: list[int]

class ResumeReport(TypedDict):
    run: int
    status: RunStatus
    agents: list[AgentResume]

DeltaArg = Union[Delta, Mapping[str, Any], bytes, None]
StepOutput = Union[bytes, None, tuple[bytes, DeltaArg]]

class Atom:
    """One recorded atom: its identity, status and output."""

    @property
    def id(self) -> int: ...
    @property
    def run(self) -> int: ...
    @property
    def agent(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def parents(self) -> list[int]: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def status(self) -> Literal["running", "completed", "failed"]: ...
    @property
    def retryable(self) -> bool: ...
    @property
    def started_at_unix_us(self) -> int: ...
    @property
    def ended_at_unix_us(self) -> Optional[int]: ...
    @property
    def result(self) -> Optional[bytes]: ...
    @property
    def delta(self) -> Optional[Delta]: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def abandoned(self) -> bool: ...
    @property
    def delta_reclaimed(self) -> bool: ...

class Executed:
    """What ``Store.execute`` returns: the atom and its output, recorded now or earlier."""

    @property
    def atom(self) -> int: ...
    @property
    def result(self) -> bytes: ...
    @property
    def delta(self) -> Delta: ...
    @property
    def replayed(self) -> bool: ...
    @property
    def delta_reclaimed(self) -> bool: ...

class History(Iterator[Atom]):
    """Atoms read by ``Store.agent_history`` or ``Store.run_history``."""

    def __iter__(self) -> History: ...
    def __next__(self) -> Atom: ...
    def __len__(self) -> int: ...

class Store:
    """An open continuum store: one directory, opened by one process at a time."""

    def __init__(
        self,
        path: Union[str, PathLike[str]],
        *,
        durability: Optional[Literal["sync", "buffered", "none"]] = None,
        flush_interval: Optional[float] = None,
        recovery_mode: Optional[Literal["tolerate_torn_tail", "strict", "skip_corrupted"]] = None,
        segment_bytes: Optional[int] = None,
        snapshot_every_atoms: Optional[int] = None,
        snapshot_every: Optional[float] = None,
        snapshots_per_agent: Optional[int] = None,
        finished_run_age: Optional[float] = None,
        commit_spin: Optional[float] = None,
        background: Optional[bool] = None,
        read_only: bool = False,
    ) -> None: ...
    @property
    def path(self) -> pathlib.Path: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Store: ...
    def __exit__(self, *exc: object) -> bool: ...
    def create_run(
        self,
        name: str,
        *,
        pipeline: str = "",
        pipeline_version: str = "",
        environment: Optional[Mapping[str, str]] = None,
    ) -> int: ...
    def runs(self) -> list[RunInfo]: ...
    def run_id(self, name: str) -> Optional[int]: ...
    def run_status(self, run: int) -> RunStatus: ...
    def finish_run(self, run: int, success: bool = True, resume_hint: str = "") -> None: ...
    def record_atom(
        self,
        run: int,
        agent: str,
        key: str,
        parents: Sequence[int] = (),
        result: bytes = b"",
        delta: DeltaArg = None,
        idempotency_key: str = "",
    ) -> int: ...
    def begin_atom(
        self, run: int, agent: str, key: str, parents: Sequence[int] = (), idempotency_key: str = ""
    ) -> int: ...
    def complete_atom(self, atom: int, result: bytes = b"", delta: DeltaArg = None) -> None: ...
    def fail_atom(self, atom: int, message: str, retryable: bool = False) -> None: ...
    def execute(
        self, run: int, agent: str, key: str, parents: Sequence[int], fn: Callable[[int], StepOutput]
    ) -> Executed: ...
    def guarded(self, atom: int, operation: str, fn: Callable[[str], bytes]) -> bytes: ...
    def guard_key(self, atom: int, operation: str) -> str: ...
    def resolve_guard(self, key: str, result: bytes) -> None: ...
    def atom(self, atom: int) -> Atom: ...
    def atom_by_key(
        self, run: int, agent: str, key: str, parents: Optional[Sequence[int]] = None
    ) -> Optional[int]: ...
    def last_agent_atom(self, run: int, agent: str) -> Optional[int]: ...
    def run_atoms(self, run: int) -> list[int]: ...
    def agent_atoms(self, run: int, agent: str) -> list[int]: ...
    def agent_history(
        self, run: int, agent: str, *, newest_first: bool = False, limit: Optional[int] = None
    ) -> History: ...
    def run_history(self, run: int, *, newest_first: bool = False, limit: Optional[int] = None) -> History: ...
    def resume(self, run: int) -> ResumeReport: ...
    def rebuild_context(self, atom: int) -> Context: ...
    def snapshot_now(self, atom: int) -> None: ...
    def fork(self, run: int, agent: str, from_atom: int, key: str) -> int: ...
    def rollback(self, run: int, agent: str, to: int, reason: str = "") -> list[int]: ...
    def pin(self, atom: int, pinned: bool = True) -> None: ...
    def compact(self) -> dict[str, int]: ...
    def request_stop(self) -> bool: ...
    def is_stop_requested(self) -> bool: ...
    def sync(self) -> None: ...
    def metrics(self) -> dict[str, Any]: ...
