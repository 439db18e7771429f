"""Round trips through `continuum.Store`: runs, atoms, deltas, contexts, history, branches,
and the promise that survives a close and a reopen: a completed step never runs again."""

from __future__ import annotations

import pathlib

import pytest

import continuum

DELTA = {
    "messages": [
        {"role": "user", "content": "book a flight"},
        {"role": "assistant", "content": "", "tool_call": {"id": "c1", "name": "search", "arguments": "{}"}},
    ],
    "tool_outputs": {"c1": b"3 flights"},
    "intermediate_results": {"plan": b"cheapest"},
    "state": {"budget": b"500", "gone": None},
}


def test_record_atom_round_trips_result_and_delta(store: continuum.Store) -> None:
    run = store.create_run("trip", pipeline="travel", pipeline_version="1.3")
    assert store.create_run("trip") == run
    assert store.run_id("trip") == run
    atom = store.record_atom(run, "planner", "step-1", [], b"plan ready", DELTA, idempotency_key="ckpt-1")
    found = store.atom(atom)
    assert (found.id, found.run, found.agent, found.key) == (atom, run, "planner", "step-1")
    assert found.status == "completed"
    assert found.result == b"plan ready"
    assert found.idempotency_key == "ckpt-1"
    assert found.delta["messages"] == DELTA["messages"]
    assert found.delta["tool_outputs"] == {"c1": b"3 flights"}
    assert found.delta["state"] == {"budget": b"500", "gone": None}
    assert found.ended_at_unix_us >= found.started_at_unix_us > 0


def test_contexts_fold_deltas_along_the_dag(store: continuum.Store) -> None:
    run = store.create_run("fold")
    first = store.record_atom(run, "a", "1", [], b"", {"state": {"x": b"1", "y": b"2"}})
    second = store.record_atom(run, "a", "2", [first], b"", {"state": {"x": b"3", "y": None}, "messages": [
        {"role": "user", "content": "hi"}
    ]})
    assert store.rebuild_context(first)["state"] == {"x": b"1", "y": b"2"}
    context = store.rebuild_context(second)
    assert context["state"] == {"x": b"3"}
    assert context["messages"] == [{"role": "user", "content": "hi"}]
    store.snapshot_now(second)
    assert store.rebuild_context(second) == context


def test_encoded_delta_bytes_are_accepted_and_garbage_refused(store: continuum.Store) -> None:
    run = store.create_run("encoded")
    # Field 5 (drop_oldest_messages) = 2: a valid protobuf `Delta`.
    atom = store.record_atom(run, "a", "1", [], b"", b"\x28\x02")
    assert store.atom(atom).delta["drop_oldest_messages"] == 2
    with pytest.raises(continuum.InvalidArgumentError):
        store.record_atom(run, "a", "2", [atom], b"", b"\xff\xff")
    with pytest.raises(continuum.InvalidArgumentError, match="unknown delta key"):
        store.record_atom(run, "a", "2", [atom], b"", {"stat": {}})
    assert store.run_atoms(run) == [atom]


def test_begin_complete_fail_and_resume(store: continuum.Store) -> None:
    run = store.create_run("protocol")
    done = store.begin_atom(run, "worker", "1")
    store.complete_atom(done, b"ok", {"state": {"k": b"v"}})
    running = store.begin_atom(run, "worker", "2", [done])
    report = store.resume(run)
    assert report["run"] == run
    assert report["status"] == {"status": "running"}
    (agent,) = report["agents"]
    assert agent["agent"] == "worker"
    assert agent["completed"] == [done]
    assert agent["first_incomplete"] == running
    store.fail_atom(running, "tool timed out", retryable=False)
    assert store.atom(running).status == "failed"
    assert store.atom(running).error == "tool timed out"
    assert store.resume(run)["agents"][0]["failed"] == [running]
    store.finish_run(run, True, "all done")
    assert store.run_status(run) == {"status": "finished", "success": True, "resume_hint": "all done"}


def test_history_iterates_oldest_or_newest_first(store: continuum.Store) -> None:
    run = store.create_run("history")
    parents: list[int] = []
    for step in range(5):
        parents = [store.record_atom(run, "planner", f"step-{step}", parents, bytes([step]))]
        store.record_atom(run, "critic", f"review-{step}", parents, b"")
    assert [atom.result for atom in store.agent_history(run, "planner")] == [bytes([i]) for i in range(5)]
    newest = store.agent_history(run, "planner", newest_first=True, limit=2)
    assert len(newest) == 2
    assert [atom.key for atom in newest] == ["step-4", "step-3"]
    assert len(list(store.run_history(run))) == 10
    assert store.agent_atoms(run, "critic") == [atom.id for atom in store.agent_history(run, "critic")]
    assert store.agent_history(run, "nobody").__len__() == 0


def test_fork_and_rollback(store: continuum.Store) -> None:
    run = store.create_run("branches")
    one = store.record_atom(run, "a", "1", [], b"1")
    two = store.record_atom(run, "a", "2", [one], b"2")
    assert store.last_agent_atom(run, "a") == two
    assert store.rollback(run, "a", one, "retry step 2") == [two]
    assert store.atom(two).abandoned
    assert store.last_agent_atom(run, "a") == one
    fork = store.fork(run, "a", one, "2-again")
    assert store.atom(fork).parents == [one]
    assert store.atom(fork).status == "running"
    store.complete_atom(fork, b"2b")
    assert store.atom_by_key(run, "a", "2-again") == fork
    assert store.atom_by_key(run, "a", "2-again", [one]) == fork
    assert store.atom_by_key(run, "a", "missing") is None


def test_execute_never_reruns_a_completed_step_across_reopen(store_dir: pathlib.Path) -> None:
    calls: list[int] = []

    def step(atom: int) -> tuple[bytes, dict]:
        calls.append(atom)
        return b"plan", {"state": {"plan": b"v1"}}

    with continuum.Store(store_dir) as store:
        run = store.create_run("once")
        first = store.execute(run, "planner", "step-1", [], step)
        assert (first.replayed, first.result) == (False, b"plan")
    for _ in range(2):
        with continuum.Store(store_dir) as store:
            again = store.execute(run, "planner", "step-1", [], step)
            assert again.replayed
            assert (again.atom, again.result) == (first.atom, b"plan")
            assert again.delta["state"] == {"plan": b"v1"}
    assert calls == [first.atom]


def test_execute_exception_fails_the_atom_and_propagates(store: continuum.Store) -> None:
    run = store.create_run("failing")
    calls = []

    def flaky(atom: int) -> bytes:
        calls.append(atom)
        if len(calls) == 1:
            raise ConnectionError("LLM unreachable")
        return b"answer"

    with pytest.raises(ConnectionError, match="LLM unreachable"):
        store.execute(run, "agent", "ask", [], flaky)
    failed = store.atom(calls[0])
    assert (failed.status, failed.retryable) == ("failed", True)
    assert "LLM unreachable" in failed.error
    # A retryable failure runs again, as the same atom.
    assert store.execute(run, "agent", "ask", [], flaky).result == b"answer"
    assert calls == [calls[0], calls[0]]


def test_execute_permanent_failure_is_returned_without_running_again(store: continuum.Store) -> None:
    run = store.create_run("permanent")
    calls = []

    def refuse(atom: int) -> bytes:
        calls.append(atom)
        raise continuum.Failure("card declined")

    with pytest.raises(continuum.Failure):
        store.execute(run, "agent", "pay", [], refuse)
    with pytest.raises(continuum.AtomFailedError) as failed:
        store.execute(run, "agent", "pay", [], refuse)
    assert failed.value.atom == calls[0]
    assert failed.value.retryable is False
    assert "card declined" in failed.value.message
    assert len(calls) == 1


def test_execute_with_a_bad_return_value_fails_retryably(store: continuum.Store) -> None:
    run = store.create_run("bad-return")
    with pytest.raises(continuum.InvalidArgumentError, match="must return bytes"):
        store.execute(run, "agent", "step", [], lambda atom: 42)
    assert store.execute(run, "agent", "step", [], lambda atom: None).result == b""


def test_guarded_runs_an_effect_once_and_not_when_it_raises(store: continuum.Store) -> None:
    run = store.create_run("guarded")
    step = store.record_atom(run, "agent", "book", [], b"")
    keys: list[str] = []

    def book(key: str) -> bytes:
        keys.append(key)
        if len(keys) == 1:
            raise TimeoutError("airline API timed out")
        return b"PNR 7XK2"

    with pytest.raises(TimeoutError):
        store.guarded(step, "book_flight", book)
    assert store.guarded(step, "book_flight", book) == b"PNR 7XK2"
    assert store.guarded(step, "book_flight", book) == b"PNR 7XK2"
    assert keys == [store.guard_key(step, "book_flight")] * 2
    assert keys[0].endswith("/agent/book/book_flight")


def test_guarded_permanent_failure(store: continuum.Store) -> None:
    run = store.create_run("guard-fails")
    step = store.record_atom(run, "agent", "pay", [], b"")
    with pytest.raises(continuum.Failure):
        store.guarded(step, "charge", lambda key: (_ for _ in ()).throw(continuum.Failure("declined")))
    with pytest.raises(continuum.GuardFailedError) as failed:
        store.guarded(step, "charge", lambda key: b"never")
    assert failed.value.key == store.guard_key(step, "charge")
    assert failed.value.retryable is False


def test_metrics_is_a_dict_of_counters_and_histograms(store: continuum.Store) -> None:
    run = store.create_run("metrics")
    store.record_atom(run, "a", "1", [], b"x")
    metrics = store.metrics()
    assert metrics["records"] >= 2
    assert metrics["fdatasyncs"] >= 1
    assert set(metrics["fdatasync_ns"]) == {"count", "sum", "max"}
    assert metrics["fdatasync_ns"]["count"] >= 1
    assert metrics["errors"]["io"] == 0


def test_options_are_applied_and_checked(store_dir: pathlib.Path) -> None:
    with continuum.Store(store_dir, durability="buffered", flush_interval=0.01, background=False) as store:
        run = store.create_run("buffered")
        store.record_atom(run, "a", "1", [], b"x")
        store.sync()
    with pytest.raises(continuum.InvalidArgumentError, match="durability"):
        continuum.Store(store_dir, durability="sometimes")
    with pytest.raises(continuum.InvalidArgumentError, match="flush_interval"):
        continuum.Store(store_dir, flush_interval=-1.0)
    with pytest.raises(TypeError):
        continuum.Store(store_dir, no_such_option=1)  # type: ignore[call-arg]


def test_every_public_method_has_a_docstring() -> None:
    for cls in (continuum.Store, continuum.Atom, continuum.Executed):
        assert cls.__doc__
        for name in dir(cls):
            if not name.startswith("_"):
                assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"
    assert "Example" in continuum.Store.__doc__
