"""`ContinuumSaver` under a real LangGraph `StateGraph`: checkpoints survive a close and a
reopen, an `interrupt()` resumes with `Command(resume=...)` from another store handle, only
the channels a step changed are stored again, and bad input raises without writing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

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
        ["channel:counter", "channel:messages", "element:messages:0"],
        ["channel:counter"],
    ]
    loaded = saver.get_tuple(stored2)
    assert loaded is not None
    assert loaded.checkpoint["channel_values"] == {"messages": ["a" * 500], "counter": 2}
    assert loaded.parent_config["configurable"]["checkpoint_id"] == stored1["configurable"]["checkpoint_id"]


def _valid_checkpoint(step: int) -> dict:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"n": step}
    checkpoint["channel_versions"] = {"n": step + 1}
    return checkpoint


def test_bad_input_raises_and_writes_nothing(store_dir: pathlib.Path) -> None:
    store = continuum.Store(store_dir)
    saver = ContinuumSaver(store)
    theirs = saver.put({"configurable": {"thread_id": "theirs"}}, _valid_checkpoint(0), {}, {"n": 1})
    records = store.metrics()["records"]
    runs = store.runs()
    mine = {"configurable": {"thread_id": "mine", "checkpoint_ns": ""}}
    unserializable = _valid_checkpoint(0)
    unserializable["channel_values"] = {"n": object()}
    bad_calls = [
        (continuum.InvalidArgumentError, lambda: saver.put({"configurable": {}}, _valid_checkpoint(0), {}, {})),
        (continuum.InvalidArgumentError, lambda: saver.put({}, _valid_checkpoint(0), {}, {})),
        (continuum.InvalidArgumentError, lambda: saver.put({"configurable": {"thread_id": ""}}, _valid_checkpoint(0), {}, {})),
        (continuum.InvalidArgumentError, lambda: saver.get_tuple({"configurable": {"checkpoint_id": "x"}})),
        (continuum.InvalidArgumentError, lambda: list(saver.list({"configurable": {"checkpoint_ns": ""}}))),
        (continuum.InvalidArgumentError, lambda: saver.put_writes(mine, [("n", 1)], "task")),
        (continuum.InvalidArgumentError,
         lambda: saver.put({"configurable": {"thread_id": "mine", "checkpoint_ns": 7}}, _valid_checkpoint(0), {}, {})),
        # A parent checkpoint from another thread: refused, not linked to nothing.
        (continuum.InvalidArgumentError,
         lambda: saver.put({"configurable": {**mine["configurable"], "checkpoint_id": theirs["configurable"]["checkpoint_id"]}},
                           _valid_checkpoint(1), {}, {"n": 2})),
        (TypeError, lambda: saver.put(mine, unserializable, {}, {"n": 1})),
        (TypeError, lambda: saver.put(mine, _valid_checkpoint(0), {"source": object()}, {"n": 1})),
        (TypeError, lambda: saver.put_writes({"configurable": {**mine["configurable"], "checkpoint_id": "c"}},
                                             [("n", object())], "task")),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()
        assert (store.metrics()["records"], store.runs()) == (records, runs)
    # A checkpoint id of another thread names nothing in this one.
    assert saver.get_tuple({"configurable": {**mine["configurable"], "checkpoint_id": theirs["configurable"]["checkpoint_id"]}}) is None
    # The store goes on: the same saver stores and reads a checkpoint.
    stored = saver.put(mine, _valid_checkpoint(0), {"step": 0}, {"n": 1})
    loaded = saver.get_tuple(stored)
    assert loaded is not None and loaded.checkpoint["channel_values"] == {"n": 0}
    store.close()
    for call in (lambda: saver.get_tuple(mine), lambda: saver.put(stored, _valid_checkpoint(1), {}, {"n": 2}),
                 lambda: list(saver.list(None)), lambda: saver.delete_thread("mine")):
        with pytest.raises(continuum.ClosedError):
            call()


def test_from_path_refuses_unknown_options_and_a_held_directory(store_dir: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="bogus"):
        with ContinuumSaver.from_path(store_dir, bogus=1):
            pass
    assert not store_dir.exists()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, continuum; store = continuum.Store(sys.argv[1]); print('held', flush=True); "
         "sys.stdin.read()", str(store_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    try:
        with pytest.raises(continuum.LockedError):
            with ContinuumSaver.from_path(store_dir):
                pass
    finally:
        holder.communicate("")
    with ContinuumSaver.from_path(store_dir) as saver:
        stored = saver.put({"configurable": {"thread_id": "t"}}, _valid_checkpoint(0), {}, {"n": 1})
        assert saver.get_tuple(stored) is not None
