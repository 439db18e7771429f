"""A LangGraph checkpointer on a continuum store: ``ContinuumSaver``.

Each LangGraph thread is a continuum run (``langgraph:<thread_id>``, or the run the run
``langgraph-threads`` maps the thread to once it is rewritten), each checkpoint
namespace an agent of it (``ns:<checkpoint_ns>``), and each checkpoint one atom of that
agent, recorded durably in one batch by ``put``, whose parent is the atom of the checkpoint's
parent. The atom's result holds the checkpoint (without its channel values) and its
metadata; its delta sets one state key per channel named in ``new_versions``
(``channel:<name>``), holding that version's value, and the context the store rebuilds at a
checkpoint's atom (the fold of the deltas along its ancestry) holds the value of every channel
as of that checkpoint. A list is stored element by element (``continuum/_channels.py``): the
version's key holds its length, and the delta sets ``element:<name>:<i>`` only from the first
position where the list differs from the parent checkpoint's, so a message list that grows by
one message costs the step that one message. Pending writes are atoms of the agent
``writes:<checkpoint_ns>``, keyed ``<checkpoint_id>/<n>``. Values go through the saver's
``serde``: the store sees only opaque ``(type, bytes)`` pairs. ``prune`` and
``delete_for_runs`` copy what a thread keeps into a fresh run and switch the thread to it
with one durable atom of ``langgraph-threads``.

Example::

    from continuum.langgraph import ContinuumSaver

    with ContinuumSaver.from_path("/var/lib/my-agent/store") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "trip-42"}})
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from os import PathLike
from typing import Any, Optional, Union

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

import continuum
from continuum._channels import CHANNEL_PREFIX as _CHANNEL_PREFIX
from continuum._channels import (
    EMPTY,
    EMPTY_FOLD,
    LIST,
    ElementCodec,
    Fold,
    ListMemory,
    StoredList,
    encode,
    first_part,
    load_elements,
    version_key,
)
from continuum._channels import pack as _pack
from continuum._channels import unpack as _unpack
from continuum._thread_history import NS_PREFIX as _NS_PREFIX
from continuum._thread_history import WRITES_PREFIX as _WRITES_PREFIX
from continuum._thread_history import ThreadHistory

_RUN_PREFIX = "langgraph:"
_GENERATION_PREFIX = "langgraph-gen"
_THREADS_RUN = "langgraph-threads"


def _configurable(config: RunnableConfig) -> dict[str, Any]:
    configurable = config.get("configurable") if isinstance(config, dict) else None
    if not isinstance(configurable, dict) or configurable.get("thread_id") in (None, ""):
        raise continuum.InvalidArgumentError("a checkpointer config needs configurable.thread_id")
    if not isinstance(configurable.get("checkpoint_ns", ""), str):
        raise continuum.InvalidArgumentError("configurable.checkpoint_ns must be a str")
    return configurable


def _location(config: RunnableConfig) -> tuple[str, str]:
    """(thread id, checkpoint namespace) of a config; a thread id that is not a str (an int,
    a UUID) is its str, as LangGraph's SQL savers store it."""
    configurable = _configurable(config)
    return str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")


def _generation_name(thread_id: str, generation: int) -> str:
    return f"{_GENERATION_PREFIX}{generation}:{thread_id}"


def _finish(store: continuum.Store, run: int, reason: str) -> None:
    """Finishes ``run`` unless it is finished already."""
    try:
        store.finish_run(run, False, reason)
    except continuum.RunFinishedError:
        pass


def _thread_of(run_name: str) -> Optional[str]:
    """The thread id a run's name holds, or None for a run that is no thread's."""
    if run_name.startswith(_RUN_PREFIX):
        return run_name[len(_RUN_PREFIX) :]
    if run_name.startswith(_GENERATION_PREFIX) and ":" in run_name:
        return run_name.split(":", 1)[1]
    return None


def _namespaced_key(atom: continuum.Atom) -> Optional[tuple[str, str]]:
    """(namespace, checkpoint id) of a checkpoint's atom or of a write's; None for others."""
    if atom.agent.startswith(_NS_PREFIX):
        return atom.agent[len(_NS_PREFIX) :], atom.key
    if atom.agent.startswith(_WRITES_PREFIX):
        return atom.agent[len(_WRITES_PREFIX) :], atom.key.rsplit("/", 1)[0]
    return None


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}


class ContinuumSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer storing checkpoints in a continuum ``Store``.

    Pass an open store (the saver does not close it), or use ``ContinuumSaver.from_path(dir)``
    as a context manager. Every ``put`` is durable when it returns; the ``a``-methods run the
    same calls on a worker thread, never blocking the event loop.

    Example::

        store = continuum.Store("/var/lib/my-agent/store")
        graph = builder.compile(checkpointer=ContinuumSaver(store))
    """

    store: continuum.Store

    def __init__(self, store: continuum.Store, *, serde: Optional[SerializerProtocol] = None) -> None:
        super().__init__(serde=serde)
        self.store = store
        self._threads_run_id: Optional[int] = None
        self._generation_lock = threading.Lock()
        self._lists = ListMemory()

    @classmethod
    @contextmanager
    def from_path(cls, path: Union[str, PathLike[str]], **options: Any) -> Iterator[ContinuumSaver]:
        """Opens the store at ``path`` (with ``continuum.Store``'s options) for the block.

        Example: ``with ContinuumSaver.from_path("/tmp/store") as saver: ...``
        """
        with continuum.Store(path, **options) as store:
            yield cls(store)

    # Store layout: which run holds a thread.

    def _run(self, thread_id: str, create: bool) -> Optional[int]:
        """The run holding ``thread_id`` (started if ``create`` and there is none)."""
        run = self._current_run(thread_id)
        if run is None and create:
            with self._generation_lock:
                run = self._current_run(thread_id)
                if run is None:
                    run = self._start_run(thread_id)
        return run

    def _current_run(self, thread_id: str) -> Optional[int]:
        """The run the threads run maps ``thread_id`` to, else the run ``langgraph:<thread_id>``;
        None if there is none or it is finished (the thread was deleted)."""
        mapped = self._mapped_run(thread_id)
        run = mapped[1] if mapped else self.store.run_id(_RUN_PREFIX + thread_id)
        if run is None or self.store.run_status(run)["status"] != "running":
            return None
        return run

    def _mapped_run(self, thread_id: str) -> Optional[tuple[int, int]]:
        """The thread's latest entry in the threads run: (generation, run)."""
        threads = self._threads_run(create=False)
        entry = self.store.last_agent_atom(threads, thread_id) if threads is not None else None
        if entry is None:
            return None
        atom = self.store.atom(entry)
        return int(atom.key), int(atom.result or b"0")

    def _threads_run(self, create: bool) -> Optional[int]:
        if self._threads_run_id is None:
            self._threads_run_id = self.store.create_run(_THREADS_RUN) if create else self.store.run_id(_THREADS_RUN)
        return self._threads_run_id

    def _start_run(self, thread_id: str) -> int:
        """Starts a thread's run: ``langgraph:<thread_id>`` for a thread never seen, else a new
        generation mapped by the threads run. Call with the generation lock held."""
        if self._mapped_run(thread_id) is None and self.store.run_id(_RUN_PREFIX + thread_id) is None:
            return self.store.create_run(_RUN_PREFIX + thread_id)
        generation, run = self._new_generation(thread_id)
        self._switch(thread_id, generation, run)
        return run

    def _new_generation(self, thread_id: str) -> tuple[int, int]:
        """A fresh run for the thread's next generation. A run of a generation past the mapped
        one is a rewrite that a crash interrupted: it is finished and skipped, never reused."""
        mapped = self._mapped_run(thread_id)
        generation = (mapped[0] if mapped else 0) + 1
        while (orphan := self.store.run_id(_generation_name(thread_id, generation))) is not None:
            _finish(self.store, orphan, "interrupted rewrite")
            generation += 1
        return generation, self.store.create_run(_generation_name(thread_id, generation))

    def _switch(self, thread_id: str, generation: int, run: int) -> None:
        """Maps the thread to ``run``: one atom of the threads run, durable on return. Every
        run the thread lived in before is finished after it, so retention reclaims them."""
        earlier = [run for _, run in self._thread_runs(thread_id)]
        # IMPORTANT: this one record is the switch; before it the old run is the thread, after it the new one.
        self.store.record_atom(self._threads_run(create=True), thread_id, str(generation), [], str(run).encode())
        for old in earlier:
            _finish(self.store, old, "replaced by a rewrite of the thread")

    def _thread_runs(self, thread_id: str) -> list[tuple[int, int]]:
        """Every run the thread was mapped to, and its first run: (generation, run)."""
        runs = []
        if (first := self.store.run_id(_RUN_PREFIX + thread_id)) is not None:
            runs.append((0, first))
        threads = self._threads_run(create=False)
        if threads is not None:
            runs += [(int(atom.key), int(atom.result or b"0")) for atom in self.store.agent_history(threads, thread_id)]
        return runs

    def _dump(self, value: Any) -> tuple[bytes, bytes]:
        kind, data = self.serde.dumps_typed(value)
        return kind.encode(), data

    def _load(self, kind: bytes, data: bytes) -> Any:
        return self.serde.loads_typed((kind.decode(), data))

    # Writing.

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Stores ``checkpoint`` with its metadata and the channel values named in
        ``new_versions``; durable on return. Returns the checkpoint's config."""
        thread_id, checkpoint_ns = _location(config)
        parent_id = _configurable(config).get("checkpoint_id")
        agent = _NS_PREFIX + checkpoint_ns
        run, parent = self._run(thread_id, create=False), None
        if parent_id:
            parent = self._parent_atom(run, agent, parent_id) if run is not None else None
            if parent is None:
                raise continuum.InvalidArgumentError(
                    f"parent checkpoint {parent_id} is not in thread {thread_id!r}, namespace {checkpoint_ns!r}"
                )
        stored = dict(checkpoint)
        values = stored.pop("channel_values", {})
        base = self._parent_lists(run, agent, parent, parent_id) if run is not None and parent is not None else {}
        state, lists = self._encode_channels(values, new_versions, base)
        result = _pack(*self._dump(stored), *self._dump(get_checkpoint_metadata(config, metadata)),
                       (parent_id or "").encode())
        if run is None:
            run = self._run(thread_id, create=True)
        try:
            atom = self.store.record_atom(run, agent, checkpoint["id"], [parent] if parent else [], result,
                                          {"state": state}, idempotency_key=checkpoint["id"])
        except continuum.ConflictError:
            # The checkpoint is stored already: a checkpoint id names one checkpoint.
            return _config(thread_id, checkpoint_ns, checkpoint["id"])
        self._lists.set(run, agent, atom, checkpoint["id"], lists)
        return _config(thread_id, checkpoint_ns, checkpoint["id"])

    def _parent_atom(self, run: int, agent: str, parent_id: str) -> Optional[int]:
        """The atom of checkpoint ``parent_id``: the one last put, else looked up by key."""
        last = self._lists.last(run, agent)
        if last is not None and last[1] == parent_id:
            return last[0]
        return self.store.atom_by_key(run, agent, parent_id)

    def _encode_channels(
        self, values: dict[str, Any], new_versions: ChannelVersions, base: dict[str, StoredList]
    ) -> tuple[dict[str, bytes], dict[str, StoredList]]:
        """The delta's state entries for the channels of ``new_versions``, given the parent's
        list channels ``base``, and the list channels as of the new checkpoint."""
        state: dict[str, bytes] = {}
        lists = dict(base)
        codec = ElementCodec(self.serde)
        for channel, version in new_versions.items():
            if channel in values:
                entries, stored = encode(channel, version, values[channel], base.get(channel), codec)
            else:
                entries, stored = {_CHANNEL_PREFIX + channel: _pack(version_key(version), EMPTY, b"")}, None
            state.update(entries)
            if stored is None:
                lists.pop(channel, None)
            else:
                lists[channel] = stored
        return state, lists

    def _parent_lists(self, run: int, agent: str, parent: int, parent_id: str) -> dict[str, StoredList]:
        """The list channels as of the parent checkpoint's atom: remembered from the ``put``
        that recorded it, else read from its rebuilt context."""
        remembered = self._lists.get(run, agent, parent)
        if remembered is not None:
            return remembered
        fold = Fold.of_state(self.store.rebuild_context(parent)["state"])
        codec = ElementCodec(self.serde)
        lists = {channel: stored for channel in fold.records if (stored := fold.stored_list(channel, codec)) is not None}
        self._lists.set(run, agent, parent, parent_id, lists)
        return lists

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Stores a task's writes for the checkpoint in ``config``; durable on return. A
        write's index is its position, or ``WRITES_IDX_MAP``'s for a special channel: an
        ordinary write is kept only if its (task_id, index) is new, a special one replaces."""
        thread_id, checkpoint_ns = _location(config)
        checkpoint_id = _configurable(config).get("checkpoint_id")
        if not checkpoint_id:
            raise continuum.InvalidArgumentError("put_writes needs configurable.checkpoint_id")
        entries = [
            _pack(str(WRITES_IDX_MAP.get(channel, idx)).encode(), channel.encode(), *self._dump(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        result = _pack(task_id.encode(), task_path.encode(), *entries)
        # A task's writes may be put while its checkpoint's `put` is still being recorded
        # on another thread: they name the checkpoint by key, not as a parent atom.
        run = self._run(thread_id, create=True)
        agent, sequence = _WRITES_PREFIX + checkpoint_ns, 0
        while True:
            while self.store.atom_by_key(run, agent, f"{checkpoint_id}/{sequence}") is not None:
                sequence += 1
            try:
                self.store.record_atom(run, agent, f"{checkpoint_id}/{sequence}", [], result)
                return
            except continuum.ConflictError:
                sequence += 1  # Another thread took this number.

    # Reading.

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        """The checkpoint ``config`` names (``checkpoint_id``), or the thread's latest in its
        namespace; None if there is none."""
        thread_id, checkpoint_ns = _location(config)
        run = self._run(thread_id, create=False)
        if run is None:
            return None
        agent = _NS_PREFIX + checkpoint_ns
        checkpoint_id = get_checkpoint_id(config)
        atom = self.store.atom_by_key(run, agent, checkpoint_id) if checkpoint_id else self.store.last_agent_atom(
            run, agent
        )
        if atom is None:
            return None
        try:
            found = self.store.atom(atom)
        except continuum.UnknownAtomError:
            return None  # A `put` on another thread has not recorded it yet.
        if found.status != "completed" or found.result is None:
            return None
        return self._tuple(run, thread_id, checkpoint_ns, found)

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of the thread in ``config`` (and of its namespace, if it
        names one), or of every thread; those whose metadata holds every ``filter`` item, older
        than ``before``, at most ``limit``. Each thread is read in one pass over its atoms
        (``run_history``), with no further store call per checkpoint."""
        before_id = get_checkpoint_id(before) if before else None
        wanted = get_checkpoint_id(config) if config else None
        remaining = limit
        for run, thread_id in self._threads(config):
            history = ThreadHistory(self.store.run_history(run))
            for checkpoint_ns in self._namespaces(history, config):
                for atom in reversed(history.checkpoints.get(checkpoint_ns, [])):
                    if remaining is not None and remaining <= 0:
                        return
                    if (wanted and atom.key != wanted) or (before_id and atom.key >= before_id):
                        continue
                    parts = _unpack(atom.result or b"")
                    metadata = self._load(parts[2], parts[3])
                    if filter and not all(metadata.get(key) == value for key, value in filter.items()):
                        continue
                    if remaining is not None:
                        remaining -= 1
                    yield self._listed_tuple(run, thread_id, checkpoint_ns, atom, history)

    def _listed_tuple(
        self, run: int, thread_id: str, checkpoint_ns: str, atom: continuum.Atom, history: ThreadHistory
    ) -> CheckpointTuple:
        fold = history.fold(atom.id)
        if fold is None:
            return self._tuple(run, thread_id, checkpoint_ns, atom)

        def values(checkpoint: Checkpoint) -> dict[str, Any]:
            return self._values(fold, checkpoint, partial(history.version, checkpoint_ns))

        return self._build_tuple(thread_id, checkpoint_ns, atom, values, history.writes(checkpoint_ns, atom.key))

    def _threads(self, config: Optional[RunnableConfig]) -> list[tuple[int, str]]:
        if config:
            thread_id = _location(config)[0]
            run = self._run(thread_id, create=False)
            return [] if run is None else [(run, thread_id)]
        threads = []
        for info in self.store.runs():
            thread_id = _thread_of(info["name"])
            if thread_id is not None and info["status"]["status"] == "running":
                if self._current_run(thread_id) == info["id"]:
                    threads.append((info["id"], thread_id))
        return threads

    @staticmethod
    def _namespaces(history: ThreadHistory, config: Optional[RunnableConfig]) -> list[str]:
        if config and "checkpoint_ns" in config["configurable"]:
            return [config["configurable"]["checkpoint_ns"]]
        return list(history.checkpoints)

    def _tuple(self, run: int, thread_id: str, checkpoint_ns: str, atom: continuum.Atom) -> CheckpointTuple:
        """A checkpoint's tuple read with store calls: its context rebuilt, its writes looked up."""

        def values(checkpoint: Checkpoint) -> dict[str, Any]:
            if not checkpoint.get("channel_versions"):
                return {}
            fold = Fold.of_state(self.store.rebuild_context(atom.id)["state"])
            return self._values(fold, checkpoint, partial(self._channel_version, run, checkpoint_ns))

        return self._build_tuple(thread_id, checkpoint_ns, atom, values, self._write_results(run, checkpoint_ns, atom.key))

    def _build_tuple(
        self,
        thread_id: str,
        checkpoint_ns: str,
        atom: continuum.Atom,
        values: Callable[[Checkpoint], dict[str, Any]],
        writes: list[bytes],
    ) -> CheckpointTuple:
        checkpoint_kind, checkpoint_data, metadata_kind, metadata_data, parent_id = _unpack(atom.result or b"")
        checkpoint = self._load(checkpoint_kind, checkpoint_data)
        checkpoint["channel_values"] = values(checkpoint)
        parent = parent_id.decode()
        return CheckpointTuple(
            config=_config(thread_id, checkpoint_ns, atom.key),
            checkpoint=checkpoint,
            metadata=self._load(metadata_kind, metadata_data),
            parent_config=_config(thread_id, checkpoint_ns, parent) if parent else None,
            pending_writes=self._pending_writes(writes),
        )

    def _values(
        self,
        fold: Fold,
        checkpoint: Checkpoint,
        find_version: Callable[[str, Any], Optional[tuple[bytes, Fold]]],
    ) -> dict[str, Any]:
        """The checkpoint's channel values: each channel's version from ``fold`` (the fold of
        its ancestry), else from ``find_version`` (a version stored off the ancestry: a
        checkpoint put without its parent, or versions shared across branches), whose list
        elements are read from the fold it was written in. A list's elements are deserialized
        once per fold family: the rows of one ``list`` share them, each row with a list of its
        own."""
        values: dict[str, Any] = {}
        for channel, version in checkpoint.get("channel_versions", {}).items():
            record, where = fold.record(channel), fold
            if record is None or first_part(record) != version_key(version):
                found = find_version(channel, version)
                if found is None:
                    continue
                record, where = found
            _, kind, data = _unpack(record)
            if kind == LIST:
                values[channel] = load_elements(where.list_elements(channel, data), self._load)
            elif kind != EMPTY:
                values[channel] = self._load(kind, data)
        return values

    def _channel_version(self, run: int, checkpoint_ns: str, channel: str, version: Any) -> Optional[tuple[bytes, Fold]]:
        for atom in self.store.agent_history(run, _NS_PREFIX + checkpoint_ns, newest_first=True):
            stored = (atom.delta or {}).get("state", {}).get(_CHANNEL_PREFIX + channel)
            if stored is not None and first_part(stored) == version_key(version):
                if _unpack(stored)[1] != LIST:
                    return stored, EMPTY_FOLD
                return stored, Fold.of_state(self.store.rebuild_context(atom.id)["state"])
        return None

    def _write_results(self, run: int, checkpoint_ns: str, checkpoint_id: str) -> list[bytes]:
        agent, sequence, results = _WRITES_PREFIX + checkpoint_ns, 0, []
        while (atom := self.store.atom_by_key(run, agent, f"{checkpoint_id}/{sequence}")) is not None:
            sequence += 1
            found = self.store.atom(atom)
            if found.result is not None:
                results.append(found.result)
        return results

    def _pending_writes(self, results: list[bytes]) -> list[tuple[str, str, Any]]:
        """A checkpoint's writes from its write atoms' results: an ordinary write keeps the
        first value of its (task id, index), a special channel's the last; in
        ``writes_sort_key`` order."""
        if not results:
            return []
        kept: dict[tuple[str, int], tuple[str, str, str, bytes, bytes]] = {}
        for result in results:
            parts = _unpack(result)
            task_id, task_path = parts[0].decode(), parts[1].decode()
            for entry in parts[2:]:
                idx, channel, kind, data = _unpack(entry)
                key = (task_id, int(idx))
                if key[1] >= 0 and key in kept:
                    continue
                kept[key] = (task_path, task_id, channel.decode(), kind, data)
        ordered = sorted(kept.items(), key=lambda item: writes_sort_key(item[1][0], item[0][0], item[0][1]))
        return [(task_id, channel, self._load(kind, data)) for _, (_, task_id, channel, kind, data) in ordered]

    # Deleting.

    def delete_thread(self, thread_id: str) -> None:
        """Deletes the thread's checkpoints and writes: its run is finished, and a later
        ``put`` starts a new one. Retention (``finished_run_age``) reclaims the space."""
        with self._generation_lock:
            run = self._current_run(str(thread_id))
            if run is not None:
                _finish(self.store, run, "deleted by delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Deletes every checkpoint whose metadata's ``run_id`` is one of ``run_ids``, with its
        writes, in every thread: each thread holding one is rewritten without them."""
        doomed = set(run_ids)
        if not doomed:
            return
        for run, thread_id in self._threads(None):
            if any(self._checkpoint_run_id(atom) in doomed for atom in self._checkpoints(run)):
                self._rewrite(thread_id, lambda atom: self._checkpoint_run_id(atom) not in doomed)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prunes the threads: ``"keep_latest"`` keeps each namespace's latest checkpoint (with
        its channel values and writes), ``"delete"`` deletes the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise continuum.InvalidArgumentError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in map(str, thread_ids):
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            run = self._current_run(thread_id)
            if run is not None:
                latest = {self.store.last_agent_atom(run, agent) for agent in self._agents(run, _NS_PREFIX)}
                self._rewrite(thread_id, lambda atom: atom.id in latest)

    def _checkpoints(self, run: int) -> Iterator[continuum.Atom]:
        for agent in self._agents(run, _NS_PREFIX):
            yield from self.store.agent_history(run, agent)

    def _checkpoint_run_id(self, atom: continuum.Atom) -> Any:
        parts = _unpack(atom.result or b"")
        return self._load(parts[2], parts[3]).get("run_id") if len(parts) == 5 else None

    def _agents(self, run: int, prefix: str) -> list[str]:
        return [entry["agent"] for entry in self.store.resume(run)["agents"] if entry["agent"].startswith(prefix)]

    def _rewrite(self, thread_id: str, keep: Callable[[continuum.Atom], bool]) -> None:
        """Moves the thread to a new run holding only the checkpoints ``keep`` accepts and their
        writes; the switch is one durable record (``_switch``), so a crash leaves the old run
        or the new one as the thread, whole. A kept checkpoint whose parent is not kept starts
        from its whole context: its delta becomes the fold of its ancestry."""
        with self._generation_lock:
            old = self._current_run(thread_id)
            if old is None:
                return
            history = [atom for atom in self.store.run_history(old) if atom.status == "completed" and not atom.abandoned]
            kept = {
                (atom.agent[len(_NS_PREFIX) :], atom.key)
                for atom in history
                if atom.agent.startswith(_NS_PREFIX) and keep(atom)
            }
            generation, new = self._new_generation(thread_id)
            copied: dict[int, int] = {}
            for atom in history:
                if _namespaced_key(atom) not in kept:
                    continue
                parents = [copied[parent] for parent in atom.parents if parent in copied]
                delta = atom.delta
                if len(parents) < len(atom.parents):
                    delta = {"state": self.store.rebuild_context(atom.id)["state"]}
                copied[atom.id] = self.store.record_atom(
                    new, atom.agent, atom.key, parents, atom.result or b"", delta,
                    idempotency_key=atom.idempotency_key,
                )
            self._switch(thread_id, generation, new)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint and write of one thread to another: each atom of the
        source's run is recorded again in the target's, in the same order, with its parents
        mapped, so the copy's checkpoints keep their ids, order, values and writes. A
        checkpoint the target already holds is kept as it is."""
        source = self._run(str(source_thread_id), create=False)
        if source is None:
            return
        target = self._run(str(target_thread_id), create=True)
        copied: dict[int, int] = {}
        for atom in self.store.run_history(source):
            if atom.status != "completed" or atom.abandoned:
                continue
            parents = [copied[parent] for parent in atom.parents if parent in copied]
            try:
                copied[atom.id] = self.store.record_atom(
                    target, atom.agent, atom.key, parents, atom.result or b"", atom.delta,
                    idempotency_key=atom.idempotency_key,
                )
            except continuum.ConflictError as existing:
                copied[atom.id] = existing.atom

    # Versions.

    def get_next_version(self, current: Optional[Union[int, str]], channel: None = None) -> Union[int, str]:
        """The version after ``current``: 1 for a new channel, then ``current + 1``. A thread
        whose versions are strings (``"<n>.<fraction>"``, as ``InMemorySaver`` writes them,
        copied in) goes on in that form, so versions keep comparing in order.

        Example: ``saver.get_next_version(None, None) == 1``, ``saver.get_next_version(1, None) == 2``
        """
        if current is None:
            return 1
        if isinstance(current, str):
            return f"{int(current.split('.')[0]) + 1:032}.{random.random():016}"
        return current + 1

    # Async twins: the same calls on a worker thread.

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        """``get_tuple`` off the event loop."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list`` off the event loop."""
        tuples = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in tuples:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``put`` off the event loop."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``put_writes`` off the event loop."""
        await asyncio.to_thread(partial(self.put_writes, config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread`` off the event loop."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """``copy_thread`` off the event loop."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """``delete_for_runs`` off the event loop."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``prune`` off the event loop."""
        await asyncio.to_thread(partial(self.prune, thread_ids, strategy=strategy))


__all__ = ["ContinuumSaver"]
