"""`prune` and `delete_for_runs` rewrite a thread into a new run and switch to it with one
durable record. These tests guard the three ways that can go wrong: a kept checkpoint that
loses the channel values its dropped ancestors held, a process killed in the middle of a
rewrite that leaves no thread, a half-copied one, or both old and new, and runs a rewrite
leaves behind that retention can never reclaim."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.types import Command  # noqa: E402

import continuum  # noqa: E402
from continuum.langgraph import ContinuumSaver  # noqa: E402
from graphs import build_approval  # noqa: E402


def _checkpoint(values: dict, versions: dict) -> dict:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions
    return checkpoint


def _ids(saver: ContinuumSaver, thread_id: str, checkpoint_ns: str = "") -> list[str]:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}}
    return [item.config["configurable"]["checkpoint_id"] for item in saver.list(config)]


def _running_runs(store: continuum.Store) -> list[str]:
    return sorted(info["name"] for info in store.runs() if info["status"]["status"] == "running")


def test_prune_keep_latest_keeps_the_state_and_the_graph_goes_on(store_dir: pathlib.Path) -> None:
    config = {"configurable": {"thread_id": "trip"}}
    effects: list[str] = []
    with ContinuumSaver.from_path(store_dir) as saver:
        graph = build_approval(effects).compile(checkpointer=saver)
        graph.invoke({"messages": ["hi"], "approved": False}, config)
        before = graph.get_state(config)
        saver.prune(["trip"])
        assert len(list(saver.list(config))) == 1
    with ContinuumSaver.from_path(store_dir) as saver:
        graph = build_approval(effects).compile(checkpointer=saver)
        after = graph.get_state(config)
        assert (after.values, after.next) == (before.values, before.next)
        final = graph.invoke(Command(resume="yes"), config)
        assert final["messages"] == ["hi", "plan: book flight", "human said yes", "booked"]
        assert effects == ["plan", "approve:yes", "book"]


def test_delete_for_runs_keeps_values_a_deleted_parent_introduced(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = saver.put(config, _checkpoint({"a": "A", "b": 1}, {"a": 1, "b": 1}), {"run_id": "r1"}, {"a": 1, "b": 1})
    second = saver.put(first, _checkpoint({"a": "A", "b": 2}, {"a": 1, "b": 2}), {"run_id": "r2"}, {"b": 2})
    saver.put_writes(second, [("b", 3)], "task")
    saver.delete_for_runs(["r1"])
    assert _ids(saver, "t") == [second["configurable"]["checkpoint_id"]]
    kept = saver.get_tuple(second)
    assert kept is not None
    assert kept.checkpoint["channel_values"] == {"a": "A", "b": 2}
    assert kept.pending_writes == [("task", "b", 3)]
    assert saver.get_tuple(first) is None


def test_rewrites_finish_the_runs_they_leave(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    parent = config
    for step in range(3):
        parent = saver.put(parent, _checkpoint({"n": step}, {"n": step + 1}), {"step": step}, {"n": step + 1})
    saver.prune(["t"])
    saver.prune(["t"])
    saver.delete_thread("t")
    assert _ids(saver, "t") == []
    saver.put(config, _checkpoint({"n": 9}, {"n": 1}), {"step": 0}, {"n": 1})
    saver.prune(["t"])
    assert len(_ids(saver, "t")) == 1
    assert _running_runs(store) == ["langgraph-gen4:t", "langgraph-threads"]
    assert [item.config["configurable"]["thread_id"] for item in saver.list(None)] == ["t"]


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import continuum
    from continuum.langgraph import ContinuumSaver

    class Dying:
        # The store, killing its process with SIGKILL before its n-th write call.
        def __init__(self, store, calls):
            self._store, self._calls = store, calls
        def __getattr__(self, name):
            method = getattr(self._store, name)
            if name not in ("create_run", "record_atom", "finish_run"):
                return method
            def call(*args, **kwargs):
                if self._calls == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                self._calls -= 1
                return method(*args, **kwargs)
            return call

    store = continuum.Store(sys.argv[1])
    ContinuumSaver(Dying(store, int(sys.argv[2]))).prune(["t"])
    print("done", flush=True)
    """
)


def _thread_with_two_namespaces(store_dir: pathlib.Path) -> tuple[list[str], list[str]]:
    """Three checkpoints and writes in the root namespace, two in a child: every id, and the
    ids keep_latest keeps."""
    with ContinuumSaver.from_path(store_dir) as saver:
        latest = []
        for checkpoint_ns, count in (("", 3), ("child:1", 2)):
            parent = {"configurable": {"thread_id": "t", "checkpoint_ns": checkpoint_ns}}
            for step in range(count):
                checkpoint = _checkpoint({"n": step, "m": "x" * step}, {"n": step + 1, "m": step + 1})
                parent = saver.put(parent, checkpoint, {"step": step}, {"n": step + 1, "m": step + 1})
                saver.put_writes(parent, [("n", step * 10)], f"task-{step}")
            latest.append(parent["configurable"]["checkpoint_id"])
        return _ids(saver, "t") + _ids(saver, "t", "child:1"), latest


def test_prune_killed_at_every_write_leaves_the_old_thread_or_the_new(tmp_path: pathlib.Path) -> None:
    pristine = tmp_path / "pristine"
    every, latest = _thread_with_two_namespaces(pristine)
    outcomes = set()
    for calls in range(12):
        store_dir = tmp_path / f"killed-{calls}"
        shutil.copytree(pristine, store_dir)
        child = subprocess.run(
            [sys.executable, "-c", KILLER, str(store_dir), str(calls)],
            capture_output=True, text=True, cwd=pathlib.Path(__file__).parent,
        )
        killed = child.returncode == -signal.SIGKILL
        assert killed or (child.returncode, child.stdout) == (0, "done\n"), child.stderr
        with ContinuumSaver.from_path(store_dir) as saver:
            visible = _ids(saver, "t") + _ids(saver, "t", "child:1")
            assert visible in (every, latest), f"killed before write call {calls}: {visible}"
            outcomes.add(("old" if visible == every else "new", killed))
            head = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
            assert head is not None
            assert head.checkpoint["channel_values"] == {"n": 2, "m": "xx"}
            assert head.pending_writes == [("task-2", "n", 20)]
            # A later rewrite finishes what the killed one left: one running run for the thread.
            saver.prune(["t"])
            assert _ids(saver, "t") + _ids(saver, "t", "child:1") == latest
            thread_runs = [name for name in _running_runs(saver.store) if name != "langgraph-threads"]
            assert len(thread_runs) == 1, thread_runs
            assert len(list(saver.list(None))) == 2
        if not killed:
            break
    assert outcomes >= {("old", True), ("new", True), ("new", False)}, outcomes
