"""Python threads share the store: every call releases the GIL while it waits on the disk,
so concurrent durable atoms share `fdatasync`s (group commit) instead of taking turns."""

from __future__ import annotations

import threading

import continuum

THREADS = 8
ATOMS_PER_THREAD = 40


def test_threads_record_concurrently_and_share_group_commits(store: continuum.Store) -> None:
    run = store.create_run("threads")
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def agent(index: int) -> None:
        try:
            start.wait()
            parents: list[int] = []
            for step in range(ATOMS_PER_THREAD):
                result = f"{index}:{step}".encode()
                parents = [store.record_atom(run, f"agent-{index}", f"step-{step}", parents, result)]
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    before = store.metrics()
    threads = [threading.Thread(target=agent, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    after = store.metrics()
    for index in range(THREADS):
        results = [atom.result for atom in store.agent_history(run, f"agent-{index}")]
        assert results == [f"{index}:{step}".encode() for step in range(ATOMS_PER_THREAD)]
    atoms = THREADS * ATOMS_PER_THREAD
    # With the GIL held across the sync, every atom would wait for its own fdatasync alone.
    assert after["group_batches"]["max"] > 1
    assert after["fdatasyncs"] - before["fdatasyncs"] < atoms


def test_execute_callbacks_run_on_many_threads(store: continuum.Store) -> None:
    run = store.create_run("callbacks")
    seen: list[int] = []
    lock = threading.Lock()

    def step(atom: int) -> bytes:
        with lock:
            seen.append(atom)
        return str(atom).encode()

    def agent(index: int) -> None:
        for key in range(10):
            executed = store.execute(run, f"agent-{index}", f"k{key}", [], step)
            assert executed.result == str(executed.atom).encode()

    threads = [threading.Thread(target=agent, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == sorted(store.run_atoms(run))
    assert len(seen) == THREADS * 10


def test_close_waits_for_calls_in_progress(store_dir) -> None:
    store = continuum.Store(store_dir)
    run = store.create_run("closing")
    inside = threading.Event()
    release = threading.Event()
    outcome: list[object] = []

    def slow(atom: int) -> bytes:
        inside.set()
        release.wait(5)
        return b"done"

    worker = threading.Thread(target=lambda: outcome.append(store.execute(run, "a", "slow", [], slow)))
    worker.start()
    inside.wait(5)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # waiting for the execute in progress
    release.set()
    worker.join(5)
    closer.join(5)
    assert not closer.is_alive()
    assert outcome[0].result == b"done"
    with continuum.Store(store_dir) as reopened:
        assert reopened.execute(run, "a", "slow", [], slow).replayed
