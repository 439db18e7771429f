"""`ContinuumSaver` under a real LangGraph `StateGraph`: checkpoints survive a close and a
reopen, an `interrupt()` resumes with `Command(resume=...)` from another store handle, only
the channels a step changed are stored again, and bad input raises without writing."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.types import Command  # noqa: E402

import continuum  # noqa: E402
from continuum.langgraph import ContinuumSaver  # noqa: E402
from graphs import build_approval  # noqa: E402


def test_graph_interrupts_and_resumes_after_reopen(store_dir: pathlib.Path) -> None:
    config = {"configurable": {"thread_id": "trip-42"}}
    effects: list[str] = []
    with ContinuumSaver.from_path(store_dir) as saver:
        graph = build_approval(effects).compile(checkpointer=saver)
        first = graph.invoke({"messages": ["hi"], "approved": False}, config)
        assert "__interrupt__" in first
        assert effects == ["plan"]
    with ContinuumSaver.from_path(store_dir) as saver:
        graph = build_approval(effects).compile(checkpointer=saver)
        waiting = graph.get_state(config)
        assert waiting.next == ("approve",)
        final = graph.invoke(Command(resume="yes"), config)
        assert final["messages"] == ["hi", "plan: book flight", "human said yes", "booked"]
        assert effects == ["plan", "approve:yes", "book"]
        history = list(graph.get_state_history(config))
        assert len(history) >= 4
        assert [snapshot.config["configurable"]["checkpoint_id"] for snapshot in history] == sorted(
            (snapshot.config["configurable"]["checkpoint_id"] for snapshot in history), reverse=True
        )


async def _async_run(saver: ContinuumSaver, effects: list[str]) -> dict:
    graph = build_approval(effects).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "async"}}
    await graph.ainvoke({"messages": [], "approved": False}, config)
    return await graph.ainvoke(Command(resume="no"), config)


def test_async_graph(store_dir: pathlib.Path) -> None:
    import asyncio

    effects: list[str] = []
    with ContinuumSaver.from_path(store_dir) as saver:
        final = asyncio.run(_async_run(saver, effects))
    assert final["messages"][-1] == "cancelled"


def test_put_stores_only_the_channels_in_new_versions(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    first["channel_values"] = {"messages": ["a" * 500], "counter": 1}
    first["channel_versions"] = {"messages": 1, "counter": 1}
    stored1 = saver.put(config, first, {"step": 0}, {"messages": 1, "counter": 1})
    second = empty_checkpoint()
    second["channel_values"] = {"messages": ["a" * 500], "counter": 2}
    second["channel_versions"] = {"messages": 1, "counter": 2}
    stored2 = saver.put(stored1, second, {"step": 1}, {"counter": 2})
    run = store.run_id("langgraph:t")
    atoms = [store.atom(atom) for atom in store.agent_atoms(run, "ns:")]
    assert [sorted(atom.delta["state"]) for atom in atoms] == [
        ["channel:counter", "channel:messages"],
        ["channel:counter"],
    ]
    loaded = saver.get_tuple(stored2)
    assert loaded is not None
    assert loaded.checkpoint["channel_values"] == {"messages": ["a" * 500], "counter": 2}
    assert loaded.parent_config["configurable"]["checkpoint_id"] == stored1["configurable"]["checkpoint_id"]


def test_bad_input_raises_and_writes_nothing(store_dir: pathlib.Path) -> None:
    store = continuum.Store(store_dir)
    saver = ContinuumSaver(store)
    records = store.metrics()["records"]
    with pytest.raises(continuum.InvalidArgumentError, match="thread_id"):
        saver.put({"configurable": {}}, empty_checkpoint(), {}, {})
    with pytest.raises(continuum.InvalidArgumentError, match="thread_id"):
        saver.get_tuple({})
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"bad": object()}
    checkpoint["channel_versions"] = {"bad": 1}
    with pytest.raises(TypeError):
        saver.put({"configurable": {"thread_id": "t"}}, checkpoint, {}, {"bad": 1})
    assert store.metrics()["records"] == records
    assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is None
    store.close()
    with pytest.raises(continuum.ClosedError):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
