"""One pass over a thread's atoms (``Store.run_history``): what ``ContinuumSaver.list``
needs of every checkpoint, without a store call per checkpoint. Pure: it reads atoms only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import continuum
from continuum._channels import CHANNEL_PREFIX, EMPTY_FOLD, Fold, first_part, version_key

NS_PREFIX = "ns:"
WRITES_PREFIX = "writes:"


class ThreadHistory:
    """A thread's checkpoints by namespace (oldest first), the channels at each (the fold of
    the deltas along its parents), every stored channel version with the fold it was written
    in, and the writes of each checkpoint."""

    def __init__(self, atoms: Iterable[continuum.Atom]) -> None:
        self.checkpoints: dict[str, list[continuum.Atom]] = {}
        self._folds: dict[int, Optional[Fold]] = {}
        self._versions: dict[tuple[str, str, bytes], tuple[bytes, Fold]] = {}
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
        parents = [self._folds.get(parent) for parent in atom.parents]
        if delta is None or any(fold is None for fold in parents):
            self._folds[atom.id] = None  # Not foldable from this pass: rebuilt by the store.
            return
        base = parents[0] if len(parents) == 1 else Fold.merged(parents) if parents else EMPTY_FOLD
        fold = base.apply(delta)  # type: ignore[union-attr]
        for key, record in delta.items():
            if key.startswith(CHANNEL_PREFIX) and record is not None:
                self._versions[(checkpoint_ns, key[len(CHANNEL_PREFIX) :], first_part(record))] = (record, fold)
        self._folds[atom.id] = fold

    def fold(self, atom: int) -> Optional[Fold]:
        """The channels as of a checkpoint's atom; None if the store must rebuild them (a
        delta compaction reclaimed, or a parent outside the thread's run)."""
        return self._folds.get(atom)

    def version(self, checkpoint_ns: str, channel: str, version: Any) -> Optional[tuple[bytes, Fold]]:
        """The newest stored record of a channel's version in the namespace, with the fold its
        list elements are read from."""
        return self._versions.get((checkpoint_ns, channel, version_key(version)))

    def writes(self, checkpoint_ns: str, checkpoint_id: str) -> list[bytes]:
        """The results of a checkpoint's write atoms, in their sequence order."""
        return [result for _, result in sorted(self._writes.get((checkpoint_ns, checkpoint_id), []))]


__all__ = ["NS_PREFIX", "WRITES_PREFIX", "ThreadHistory"]
