"""`list` reads a thread in one pass over its atoms (`run_history`): the number of store
calls does not grow with the checkpoints it returns, and each listed tuple equals what
`get_tuple` (a context rebuild and write lookups) reads for the same checkpoint."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

import continuum  # noqa: E402
from continuum.langgraph import ContinuumSaver  # noqa: E402


class CountingStore:
    """A store that counts its calls by name."""

    def __init__(self, store: continuum.Store) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call


def _chat(saver: ContinuumSaver, thread_id: str, steps: int) -> None:
    """The chat pattern: a growing messages channel and a counter, a write per step, and a
    second namespace; every third step changes only the counter."""
    parent = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    messages: list[str] = []
    for step in range(steps):
        changed = {"counter": step + 1}
        if step % 3:
            messages = messages + [f"message {step} " + "x" * 50]
            changed["messages"] = step + 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages, "counter": step}
        versions = dict(parent.get("versions", {}), **changed)
        checkpoint["channel_versions"] = versions
        stored = saver.put(parent, checkpoint, {"step": step}, changed)
        saver.put_writes(stored, [("counter", step), ("__error__", "boom")], f"task-{step}")
        parent = {**stored, "versions": versions}
    child = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "child:1"}}
    saver.put(child, empty_checkpoint(), {"step": 0}, {})


@pytest.mark.parametrize("steps", [10, 100])
def test_list_calls_the_store_a_fixed_number_of_times(store: continuum.Store, steps: int) -> None:
    counting = CountingStore(store)
    saver = ContinuumSaver(counting)  # type: ignore[arg-type]
    _chat(saver, "chat", steps)
    counting.calls.clear()
    listed = list(saver.list({"configurable": {"thread_id": "chat"}}))
    assert len(listed) == steps + 1
    calls = sum(counting.calls.values())
    assert calls <= 6, counting.calls
    assert counting.calls["run_history"] == 1
    for item in listed:
        assert item == saver.get_tuple(item.config)
