"""ContinuumSaver against SqliteSaver (synchronous=FULL), PostgresSaver (a local server with
fsync=on, synchronous_commit=on) and InMemorySaver on the chat pattern: one thread, each step
appends a ~500-byte message to ``messages`` (whose value, as in LangGraph's ``MessagesState``,
is the whole list) and updates two small channels.

    .venv/bin/pip install -r python/bench/requirements.txt
    .venv/bin/python python/bench/saver_bench.py [--dir DIR]

The savers run in lockstep (one put of each in turn), so that they share the moments of a
shared, noisy disk. Reports, as ratios measured in this one run: ``put`` p50 at 100, 300 and 1,000 steps;
``list`` of a 300-checkpoint thread; bytes on disk at 100, 300 and 1,000 steps; checkpoints
per second from 16 Python threads (one thread id each); and the Python layer's own time per
``put`` (the saver's p50 less the store's p50 recording the same atoms with ``record_atom``,
both without fsync). Bytes are the files' allocated blocks after a clean close; for
PostgreSQL, the saver's tables with their indexes and TOAST (``pg_total_relation_size``; the
WAL is not counted). The script starts its own PostgreSQL server (``initdb`` and ``postgres``
on PATH; ``_postgres.py``) and stops it by its process id at the end; without them, or
without ``langgraph-checkpoint-postgres``, the PostgreSQL column is skipped with a message.
Not part of the test command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import pathlib
import random
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import continuum
from continuum._channels import pack, version_key
from continuum.langgraph import ContinuumSaver

STEPS = (100, 300, 1000)
WORDS = "the agent booked a flight to berlin and asked the user whether the hotel near the station fits".split()
THREADS, THREAD_STEPS = 16, 100
Factory = Callable[[pathlib.Path], contextlib.AbstractContextManager[BaseCheckpointSaver]]


def disk_bytes(directory: pathlib.Path) -> int:
    """Bytes the directory's files take on disk (allocated blocks, as du counts them)."""
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


@dataclasses.dataclass
class Peer:
    """A saver to measure: how to open one in a directory, and the bytes it then takes."""

    open: Factory
    size: Callable[[pathlib.Path], int] = disk_bytes


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


def postgres_peer(conninfo: str) -> Peer:
    """PostgresSaver on a pool of ``THREADS`` connections, a fresh database per directory."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    def database(directory: pathlib.Path) -> str:
        return "bench_" + directory.name.replace("-", "_")

    @contextlib.contextmanager
    def open_saver(directory: pathlib.Path) -> Iterator[BaseCheckpointSaver]:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database(directory)}"')
        options = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        url = conninfo.replace("dbname=postgres", f"dbname={database(directory)}")
        with ConnectionPool(url, min_size=1, max_size=THREADS, kwargs=options) as pool:
            saver = PostgresSaver(pool)  # type: ignore[arg-type]
            saver.setup()
            yield saver

    def size(directory: pathlib.Path) -> int:
        url = conninfo.replace("dbname=postgres", f"dbname={database(directory)}")
        with psycopg.connect(url) as connection:
            row = connection.execute(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
            ).fetchone()
        return int(row[0]) if row else 0

    return Peer(open_saver, size)


def message(step: int) -> str:
    """About 500 bytes of chat text (words in a seeded random order: it compresses as text does)."""
    rng = random.Random(step)
    text = f"step {step}:"
    while len(text) < 500:
        text += " " + rng.choice(WORDS)
    return text[:500]


def chat(saver: BaseCheckpointSaver, thread_id: str, steps: int) -> list[float]:
    """Puts ``steps`` checkpoints of the chat pattern; each put's seconds."""
    return list(chat_steps(saver, thread_id, steps))


def chat_steps(saver: BaseCheckpointSaver, thread_id: str, steps: int) -> Iterator[float]:
    """Puts the chat pattern's checkpoints one per iteration, yielding each put's seconds."""
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    messages: list[str] = []
    versions: dict[str, Any] = {}
    for step in range(steps):
        messages = messages + [message(step)]
        changed = {name: saver.get_next_version(versions.get(name), None) for name in ("messages", "turn", "status")}
        versions = {**versions, **changed}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages, "turn": step, "status": f"ok {step}"}
        checkpoint["channel_versions"] = dict(versions)
        started = time.perf_counter()
        config = saver.put(config, checkpoint, {"source": "loop", "step": step}, changed)
        yield time.perf_counter() - started


def raw_chat(store: continuum.Store, steps: int) -> list[float]:
    """Records the atoms the saver records for ``chat``'s steps (one new message element, two
    small channels, the checkpoint and its metadata) with ``record_atom``; each call's seconds."""
    serde = InMemorySaver().serde
    run, parent, seconds = store.create_run("raw"), [], []
    for step in range(steps):
        state = {
            "channel:messages": pack(version_key(step + 1), b"continuum-list", str(step + 1).encode()),
            f"element:messages:{step}": pack(*(part if isinstance(part, bytes) else part.encode()
                                               for part in serde.dumps_typed(message(step)))),
        }
        for name, value in (("turn", step), ("status", f"ok {step}")):
            kind, data = serde.dumps_typed(value)
            state[f"channel:{name}"] = pack(version_key(step + 1), kind.encode(), data)
        checkpoint_kind, checkpoint_data = serde.dumps_typed(empty_checkpoint())
        metadata_kind, metadata_data = serde.dumps_typed({"source": "loop", "step": step})
        result = pack(checkpoint_kind.encode(), checkpoint_data, metadata_kind.encode(), metadata_data, b"parent")
        started = time.perf_counter()
        parent = [store.record_atom(run, "ns:", f"{step:08}", parent, result, {"state": state}, f"{step:08}")]
        seconds.append(time.perf_counter() - started)
    return seconds


def python_layer(directory: pathlib.Path, steps: int) -> tuple[float, float]:
    """p50 seconds per put of the saver and of the Rust store recording the same atoms, both
    with ``durability="none"``, so that the difference is the Python layer's own time, not the
    disk's."""
    with ContinuumSaver.from_path(directory / "saver", durability="none") as saver:
        saver_p50 = statistics.median(chat(saver, "chat", steps))
    with continuum.Store(directory / "raw", durability="none") as store:
        store_p50 = statistics.median(raw_chat(store, steps))
    return saver_p50, store_p50


def fdatasync_p50(directory: pathlib.Path, count: int = 200) -> float:
    """p50 seconds of the cheapest durable write: 512 bytes written in place into a
    preallocated file, then ``fdatasync``; the floor under every durable ``put``."""
    path = directory / "fdatasync"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(descriptor, b"\0" * 4096 * count, 0)
        os.fsync(descriptor)
        seconds = []
        for index in range(count):
            started = time.perf_counter()
            os.pwrite(descriptor, b"x" * 512, index * 4096)
            os.fdatasync(descriptor)
            seconds.append(time.perf_counter() - started)
    finally:
        os.close(descriptor)
    return statistics.median(seconds)


def threaded(saver: BaseCheckpointSaver) -> float:
    """Checkpoints per second from ``THREADS`` Python threads, one thread id each."""
    workers = [threading.Thread(target=chat, args=(saver, f"worker-{n}", THREAD_STEPS)) for n in range(THREADS)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return THREADS * THREAD_STEPS / (time.perf_counter() - started)


def list_seconds(saver: BaseCheckpointSaver) -> float:
    """Seconds of one ``list`` call over the 300-checkpoint thread."""
    started = time.perf_counter()
    assert len(list(saver.list({"configurable": {"thread_id": "chat"}}))) == 300
    return time.perf_counter() - started


def open_all(peers: dict[str, Peer], root: pathlib.Path, label: str, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Every peer's saver in a directory of its own, ``<name>-<label>``, open until ``stack`` closes."""
    savers = {}
    for name, peer in peers.items():
        directory = root / f"{name}-{label}"
        directory.mkdir()
        savers[name] = stack.enter_context(peer.open(directory))
    return savers


def lockstep(peers: dict[str, Peer], root: pathlib.Path, label: str, steps: int) -> dict[str, list[float]]:
    """The chat pattern on every peer in turn, one put each per round, so that all of them see
    the same moments of a shared, noisy disk; each peer's put seconds. At 300 steps, also 5
    rounds of ``list``, each peer in turn (the key ``list``)."""
    seconds: dict[str, list[float]] = {name: [] for name in peers}
    with contextlib.ExitStack() as stack:
        savers = open_all(peers, root, label, stack)
        loops = {name: chat_steps(saver, "chat", steps) for name, saver in savers.items()}
        for _ in range(steps):
            for name, loop in loops.items():
                seconds[name].append(next(loop))
        if steps == 300:
            for _ in range(5):
                for name, saver in savers.items():
                    seconds.setdefault(f"list {name}", []).append(list_seconds(saver))
    return seconds


def measure(peers: dict[str, Peer], root: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Every figure of every peer: puts and lists in lockstep, the 16 threads one peer after another."""
    figures: dict[str, dict[str, Any]] = {name: {} for name in peers}
    lockstep(peers, root, "warm-up", 50)
    for steps in STEPS:
        seconds = lockstep(peers, root, str(steps), steps)
        for name, peer in peers.items():
            figures[name][f"put_p50_{steps}"] = statistics.median(seconds[name])
            if steps == 300:
                figures[name]["list_300"] = statistics.median(seconds[f"list {name}"])
            figures[name][f"bytes_{steps}"] = peer.size(root / f"{name}-{steps}")
    for name, peer in peers.items():
        directory = root / f"{name}-threads"
        directory.mkdir()
        with peer.open(directory) as saver:
            figures[name]["threads_per_s"] = threaded(saver)
    return figures


def segment_bytes(directory: pathlib.Path) -> int:
    """Bytes the store's log segments take on disk (its snapshots left out)."""
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*.seg"))


def report(
    results: dict[str, dict[str, Any]], saver_p50: float, store_p50: float, syncs: list[float], segments: list[int]
) -> None:
    ours = results["continuum"]
    peers = [name for name in results if name != "continuum"]
    print("| figure | " + " | ".join(results) + " | " + " | ".join(f"continuum / {name}" for name in peers) + " |")
    print("|---" * (1 + len(results) + len(peers)) + "|")
    for key in ours:
        cells = [f"{results[name][key]:.6g}" for name in results]
        ratios = [f"{ours[key] / results[name][key]:.3f}" if results[name][key] else "" for name in peers]
        print(f"| {key} | " + " | ".join(cells + ratios) + " |")
    print(f"\nfdatasync of 512 bytes in place, p50 before / after the savers: {syncs[0] * 1e3:.3f} / {syncs[1] * 1e3:.3f} ms")
    print(f"without fsync, 300 steps: saver put p50 {saver_p50 * 1e6:.1f} us, store record_atom p50 "
          f"{store_p50 * 1e6:.1f} us: the Python layer's own time per put {(saver_p50 - store_p50) * 1e6:.1f} us")
    growth = [ours[f"bytes_{steps}"] for steps in STEPS]
    per_step = [size / steps for size, steps in zip(growth, STEPS)]
    print(f"continuum bytes at {' / '.join(map(str, STEPS))} steps: {' / '.join(map(str, growth))} "
          f"({' / '.join(f'{size:.0f}' for size in per_step)} bytes per step); its log segments alone "
          f"{' / '.join(f'{size / steps:.0f}' for size, steps in zip(segments, STEPS))} bytes per step")


def postgres_server() -> contextlib.AbstractContextManager[Optional[str]]:
    """The PostgreSQL server's connection string for the block, or None (with the reason
    printed) where none can be started."""
    import _postgres

    reason = _postgres.missing()
    if reason is None:
        try:
            import langgraph.checkpoint.postgres  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as error:
            reason = f"{error.name} is not installed (pip install -r python/bench/requirements.txt)"
    if reason is not None:
        print(f"PostgresSaver skipped: {reason}")
        return contextlib.nullcontext()
    return _postgres.server()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where the stores go (default: a temporary directory)")
    arguments = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"saver_bench {started:%Y-%m-%d %H:%M} UTC on {os.uname().sysname}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    peers = {"continuum": Peer(continuum_saver), "sqlite": Peer(sqlite_saver)}
    with postgres_server() as conninfo, tempfile.TemporaryDirectory(dir=arguments.dir) as temporary:
        if conninfo is not None:
            peers["postgres"] = postgres_peer(conninfo)
        peers["memory"] = Peer(memory_saver, lambda directory: 0)
        root = pathlib.Path(temporary)
        syncs = [fdatasync_p50(root)]
        results = measure(peers, root)
        syncs.append(fdatasync_p50(root))
        segments = [segment_bytes(root / f"continuum-{steps}") for steps in STEPS]
        raw = root / "raw"
        raw.mkdir()
        saver_p50, store_p50 = python_layer(raw, 300)
    print(f"finished {datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC, load average {os.getloadavg()[0]:.2f}; "
          "seconds and bytes, then ratios\n")
    report(results, saver_p50, store_p50, syncs, segments)


if __name__ == "__main__":
    main()
