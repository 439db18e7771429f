"""One pass over a thread's atoms (``Store.run_history``): what ``ContinuumSaver.list``
needs of every checkpoint, without a store call per checkpoint. Pure: it reads atoms only."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from typing import Any, Optional

import continuum

NS_PREFIX = "ns:"
WRITES_PREFIX = "writes:"
CHANNEL_PREFIX = "channel:"


def pack(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (u32 little-endian lengths)."""
    return b"".join(struct.pack("<I", len(part)) + part for part in parts)


def unpack(data: bytes) -> list[bytes]:
    """The parts ``pack`` joined."""
    parts, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        at += 4
        parts.append(data[at : at + length])
        at += length
    return parts


def first_part(data: bytes) -> bytes:
    """The first part ``pack`` joined, without copying the others."""
    (length,) = struct.unpack_from("<I", data, 0)
    return data[4 : 4 + length]


def version_key(version: Any) -> bytes:
    """A channel version as stored: its JSON."""
    return json.dumps(version).encode()


class ThreadHistory:
    """A thread's checkpoints by namespace (oldest first), the channel state at each (the
    fold of the deltas along its parents), every stored channel version, and the writes of
    each checkpoint."""

    def __init__(self, atoms: Iterable[continuum.Atom]) -> None:
        self.checkpoints: dict[str, list[continuum.Atom]] = {}
        self._states: dict[int, Optional[dict[str, bytes]]] = {}
        self._versions: dict[tuple[str, str, bytes], bytes] = {}
        self._writes: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        for atom in atoms:
            if atom.status != "completed" or atom.abandoned or atom.result is None:
                continue
            if atom.agent.startswith(NS_PREFIX):
                self._add_checkpoint(atom.agent[len(NS_PREFIX) :], atom)
            elif atom.agent.startswith(WRITES_PREFIX):
                checkpoint_id, sequence = atom.key.rsplit("/", 1)
                writes = self._writes.setdefault((atom.agent[len(WRITES_PREFIX) :], checkpoint_id), [])
                writes.append((int(sequence), atom.result))

    def _add_checkpoint(self, checkpoint_ns: str, atom: continuum.Atom) -> None:
        self.checkpoints.setdefault(checkpoint_ns, []).append(atom)
        delta = None if atom.delta_reclaimed else (atom.delta or {}).get("state", {})
        parents = [self._states.get(parent) for parent in atom.parents]
        if delta is None or any(state is None for state in parents):
            self._states[atom.id] = None  # Not foldable from this pass: rebuilt by the store.
            return
        state: dict[str, bytes] = {}
        for parent in parents:
            state.update(parent or {})
        for key, value in delta.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
                self._versions[(checkpoint_ns, key, first_part(value))] = value
        self._states[atom.id] = state

    def state(self, atom: int) -> Optional[dict[str, bytes]]:
        """The channel state as of a checkpoint's atom; None if the store must rebuild it (a
        delta compaction reclaimed, or a parent outside the thread's run)."""
        return self._states.get(atom)

    def version(self, checkpoint_ns: str, channel: str, version: Any) -> Optional[bytes]:
        """The newest stored value of a channel's version in the namespace."""
        return self._versions.get((checkpoint_ns, CHANNEL_PREFIX + channel, version_key(version)))

    def writes(self, checkpoint_ns: str, checkpoint_id: str) -> list[bytes]:
        """The results of a checkpoint's write atoms, in their sequence order."""
        return [result for _, result in sorted(self._writes.get((checkpoint_ns, checkpoint_id), []))]
