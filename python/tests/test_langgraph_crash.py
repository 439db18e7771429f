"""A real agent graph killed at random moments: a `StateGraph` with a fake LLM, tool nodes
(`ToolNode`) and an `interrupt()` for approval, checkpointed by `ContinuumSaver` in a child
process that is SIGKILLed in the middle of its run, again and again. Every thread must end
with the state an uninterrupted run gives, and no node or tool whose output the saver had
acknowledged may run again (each appends to an effects file outside the store, and the
child appends there each output the saver acknowledged, after `put` or `put_writes`
returned). The graph runs with `durability="sync"`: a step's writes name a checkpoint already
stored. (With LangGraph's default, "async", a task's writes may be stored for a checkpoint
whose `put` a crash then prevents; LangGraph then runs the task again from the parent.)"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.types import Command  # noqa: E402

from continuum.langgraph import ContinuumSaver  # noqa: E402
from graphs import build_travel_agent  # noqa: E402

TESTS = pathlib.Path(__file__).parent
REQUEST = {"messages": [("user", "plan a trip to Berlin")]}
EFFECTS_PER_THREAD = 9

AGENT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from langgraph.types import Command
    from continuum.langgraph import ContinuumSaver
    from graphs import build_travel_agent

    store_dir, effects, pause, thread_ids = sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5:]

    def acknowledge(thread_id, messages):
        with open(effects, "a") as file:
            for message in messages if isinstance(messages, list) else [messages]:
                if hasattr(message, "content"):  # the request is a (role, content) tuple
                    file.write(f"ack {thread_id} {message.content}\\n")

    class AcknowledgingSaver(ContinuumSaver):
        def put(self, config, checkpoint, metadata, new_versions):
            stored = super().put(config, checkpoint, metadata, new_versions)
            acknowledge(config["configurable"]["thread_id"], checkpoint["channel_values"].get("messages", []))
            return stored

        def put_writes(self, config, writes, task_id, task_path=""):
            super().put_writes(config, writes, task_id, task_path)
            for channel, value in writes:
                if channel == "messages":
                    acknowledge(config["configurable"]["thread_id"], value)

    with AcknowledgingSaver.from_path(store_dir) as saver:
        print("ready", flush=True)
        for thread_id in thread_ids:
            graph = build_travel_agent(thread_id, effects, pause).compile(checkpointer=saver)
            config = {"configurable": {"thread_id": thread_id}}
            while True:
                state = graph.get_state(config)
                if not state.values:
                    graph.invoke({"messages": [("user", "plan a trip to Berlin")]}, config, durability="sync")
                elif state.interrupts:
                    graph.invoke(Command(resume="yes"), config, durability="sync")
                elif state.next or saver.get_tuple(config).pending_writes:
                    # Tasks that finished before the crash have their writes saved: get_state
                    # no longer lists them as next, yet the step is still to be completed.
                    graph.invoke(None, config, durability="sync")
                else:
                    break
            print("done", thread_id, flush=True)
    """
)


def _reference() -> list[tuple[str, str]]:
    graph = build_travel_agent("reference").compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "reference"}}
    graph.invoke(REQUEST, config)
    final = graph.invoke(Command(resume="yes"), config)
    return [(type(message).__name__, message.content) for message in final["messages"]]


def _effect_lines(effects: pathlib.Path, thread_id: str) -> int:
    if not effects.exists():
        return 0
    return sum(1 for line in effects.read_text().splitlines() if line.startswith(f"run {thread_id} "))


def _run_and_kill(store_dir: pathlib.Path, effects: pathlib.Path, thread_id: str, rng: random.Random) -> bool:
    """Runs the agent on one thread and SIGKILLs it after a random number of effects and a
    random delay; whether it was killed before it finished."""
    child = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(TESTS), str(store_dir), str(effects), "0.01", thread_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    wanted = rng.randint(0, EFFECTS_PER_THREAD - 2)
    deadline = time.monotonic() + 30
    while _effect_lines(effects, thread_id) < wanted and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(rng.random() * 0.01)
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    output, stderr = child.communicate()
    assert child.returncode in (0, -signal.SIGKILL), stderr
    return f"done {thread_id}" not in output


def _assert_no_acknowledged_output_ran_again(effects: pathlib.Path) -> None:
    acknowledged: set[str] = set()
    for number, line in enumerate(effects.read_text().splitlines()):
        kind, rest = line.split(" ", 1)
        if kind == "ack":
            acknowledged.add(rest)
        else:
            assert rest not in acknowledged, f"effects line {number}: {rest!r} ran again after the saver acknowledged it"


def test_agent_graph_sigkilled_at_random_moments_resumes_exactly(tmp_path: pathlib.Path) -> None:
    seed = int(os.environ.get("CRASH_SEED", 0)) or int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    store_dir, effects = tmp_path / "store", tmp_path / "effects"
    thread_ids = [f"trip-{iteration}" for iteration in range(24)]
    killed = sum(_run_and_kill(store_dir, effects, thread_id, rng) for thread_id in thread_ids)
    assert killed >= 20, f"seed {seed}: only {killed} of {len(thread_ids)} runs were killed before they finished"

    # Reopen and resume every thread where it stopped, to the end.
    finish = subprocess.run(
        [sys.executable, "-c", AGENT, str(TESTS), str(store_dir), str(effects), "0", *thread_ids],
        capture_output=True, text=True, timeout=300,
    )
    assert finish.returncode == 0, finish.stderr
    _assert_no_acknowledged_output_ran_again(effects)
    expected = _reference()
    with ContinuumSaver.from_path(store_dir) as saver:
        for thread_id in thread_ids:
            graph = build_travel_agent(thread_id).compile(checkpointer=saver)
            state = graph.get_state({"configurable": {"thread_id": thread_id}})
            assert state.next == (), f"seed {seed}: {thread_id} did not finish"
            final = [(type(message).__name__, message.content) for message in state.values["messages"]]
            assert final == expected, f"seed {seed}: {thread_id}"
    ran = effects.read_text().splitlines()
    for thread_id in thread_ids:
        outputs = {line.split(" ", 2)[2] for line in ran if line.startswith(f"run {thread_id} ")}
        assert len(outputs) == EFFECTS_PER_THREAD, f"seed {seed}: {thread_id} ran {sorted(outputs)}"
