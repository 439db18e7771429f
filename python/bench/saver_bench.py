"""ContinuumSaver against SqliteSaver (synchronous=FULL) and InMemorySaver on the chat
pattern: one thread, each step appends a ~500-byte message to ``messages`` (whose value, as
in LangGraph's ``MessagesState``, is the whole list) and updates two small channels.

    .venv/bin/pip install langgraph-checkpoint-sqlite==3.1.2
    .venv/bin/python python/bench/saver_bench.py [--dir DIR]

Reports, as ratios measured in this one run: ``put`` p50 at 100, 300 and 1,000 steps;
``list`` of a 300-checkpoint thread; bytes on disk after a clean close at 100, 300 and 1,000
steps; checkpoints per second from 16 Python threads (one thread id each); and the Python
layer's own time per ``put`` (the saver's p50 less the store's p50 recording the same atoms
with ``record_atom``, both without fsync). Not part of the test command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import random
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import continuum
from continuum.langgraph import ContinuumSaver

STEPS = (100, 300, 1000)
WORDS = "the agent booked a flight to berlin and asked the user whether the hotel near the station fits".split()
THREADS, THREAD_STEPS = 16, 100
Factory = Callable[[pathlib.Path], contextlib.AbstractContextManager[BaseCheckpointSaver]]


@contextlib.contextmanager
def continuum_saver(directory: pathlib.Path) -> Iterator[BaseCheckpointSaver]:
    with ContinuumSaver.from_path(directory / "store") as saver:
        yield saver


@contextlib.contextmanager
def sqlite_saver(directory: pathlib.Path) -> Iterator[BaseCheckpointSaver]:
    connection = sqlite3.connect(directory / "checkpoints.sqlite", check_same_thread=False)
    connection.execute("PRAGMA synchronous=FULL")
    saver = SqliteSaver(connection)
    saver.setup()
    try:
        yield saver
    finally:
        connection.close()


@contextlib.contextmanager
def memory_saver(directory: pathlib.Path) -> Iterator[BaseCheckpointSaver]:
    yield InMemorySaver()


SAVERS: dict[str, Factory] = {"continuum": continuum_saver, "sqlite": sqlite_saver, "memory": memory_saver}


def message(step: int) -> str:
    """About 500 bytes of chat text (words in a seeded random order: it compresses as text does)."""
    rng = random.Random(step)
    text = f"step {step}:"
    while len(text) < 500:
        text += " " + rng.choice(WORDS)
    return text[:500]


def chat(saver: BaseCheckpointSaver, thread_id: str, steps: int) -> list[float]:
    """Puts ``steps`` checkpoints of the chat pattern; each put's seconds."""
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    messages: list[str] = []
    versions: dict[str, Any] = {}
    seconds = []
    for step in range(steps):
        messages = messages + [message(step)]
        changed = {name: saver.get_next_version(versions.get(name), None) for name in ("messages", "turn", "status")}
        versions = {**versions, **changed}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages, "turn": step, "status": f"ok {step}"}
        checkpoint["channel_versions"] = dict(versions)
        started = time.perf_counter()
        config = saver.put(config, checkpoint, {"source": "loop", "step": step}, changed)
        seconds.append(time.perf_counter() - started)
    return seconds


def disk_bytes(directory: pathlib.Path) -> int:
    """Bytes the directory's files take on disk (allocated blocks, as du counts them)."""
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


def python_layer(directory: pathlib.Path, steps: int) -> tuple[float, float]:
    """p50 seconds per put of the saver and of the Rust store recording the same atoms (same
    serializer, same sizes) with ``record_atom``, both with ``durability="none"``, so that
    the difference is the Python layer's own time, not the disk's."""
    with ContinuumSaver.from_path(directory / "saver", durability="none") as saver:
        saver_p50 = statistics.median(chat(saver, "chat", steps))
    serde = InMemorySaver().serde
    with continuum.Store(directory / "raw", durability="none") as store:
        run = store.create_run("raw")
        messages: list[str] = []
        parent: list[int] = []
        seconds = []
        for step in range(steps):
            messages = messages + [message(step)]
            state = {f"channel:{name}": serde.dumps_typed(value)[1]
                     for name, value in (("messages", messages), ("turn", step), ("status", f"ok {step}"))}
            result = serde.dumps_typed(empty_checkpoint())[1]
            started = time.perf_counter()
            parent = [store.record_atom(run, "ns:", f"{step:08}", parent, result, {"state": state}, f"{step:08}")]
            seconds.append(time.perf_counter() - started)
    return saver_p50, statistics.median(seconds)


def threaded(saver: BaseCheckpointSaver) -> float:
    """Checkpoints per second from ``THREADS`` Python threads, one thread id each."""
    workers = [threading.Thread(target=chat, args=(saver, f"worker-{n}", THREAD_STEPS)) for n in range(THREADS)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return THREADS * THREAD_STEPS / (time.perf_counter() - started)


def measure(name: str, factory: Factory, root: pathlib.Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    warm_up = root / f"{name}-warm-up"
    warm_up.mkdir()
    with factory(warm_up) as saver:
        chat(saver, "warm-up", 50)
    for steps in STEPS:
        directory = root / f"{name}-{steps}"
        directory.mkdir()
        with factory(directory) as saver:
            figures[f"put_p50_{steps}"] = statistics.median(chat(saver, "chat", steps))
            if steps == 300:
                config = {"configurable": {"thread_id": "chat"}}
                runs = []
                for _ in range(5):
                    started = time.perf_counter()
                    assert len(list(saver.list(config))) == 300
                    runs.append(time.perf_counter() - started)
                figures["list_300"] = statistics.median(runs)
        figures[f"bytes_{steps}"] = disk_bytes(directory)
    directory = root / f"{name}-threads"
    directory.mkdir()
    with factory(directory) as saver:
        figures["threads_per_s"] = threaded(saver)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where the stores go (default: a temporary directory)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=arguments.dir) as temporary:
        root = pathlib.Path(temporary)
        results = {name: measure(name, factory, root) for name, factory in SAVERS.items()}
        raw = root / "raw"
        raw.mkdir()
        saver_p50, store_p50 = python_layer(raw, 300)
    ours, sqlite, memory = results["continuum"], results["sqlite"], results["memory"]
    print(f"saver_bench on {os.uname().sysname}, {os.cpu_count()} cores; seconds and bytes, then ratios\n")
    print("| figure | continuum | sqlite (FULL) | memory | continuum / sqlite | continuum / memory |")
    print("|---|---|---|---|---|---|")
    for key in ours:
        print(f"| {key} | {ours[key]:.6g} | {sqlite[key]:.6g} | {memory[key]:.6g} | "
              f"{ours[key] / sqlite[key]:.3f} | {ours[key] / memory[key] if memory[key] else float('nan'):.3f} |")
    print(f"\nwithout fsync, 300 steps: saver put p50 {saver_p50 * 1e6:.1f} us, store record_atom p50 "
          f"{store_p50 * 1e6:.1f} us: the Python layer's own time per put {(saver_p50 - store_p50) * 1e6:.1f} us")
    print("PostgresSaver: not measured (no server is started by this script)")
    growth = [ours[f"bytes_{steps}"] for steps in STEPS]
    print(f"continuum bytes 100 -> 300 -> 1000 steps: {growth[0]} -> {growth[1]} -> {growth[2]}")


if __name__ == "__main__":
    main()
