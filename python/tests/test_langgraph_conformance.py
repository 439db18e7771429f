"""`ContinuumSaver` against langgraph-checkpoint-conformance: level FULL, every test of the
base capabilities (put, put_writes, get_tuple, list, delete_thread: 58) and of the extended
ones (delete_for_runs, copy_thread, prune: 23) passes."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.report import ProgressCallbacks  # noqa: E402

from continuum.langgraph import ContinuumSaver  # noqa: E402


@checkpointer_test(name="ContinuumSaver")
async def continuum_saver():  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as directory:
        with ContinuumSaver.from_path(pathlib.Path(directory) / "store") as saver:
            yield saver


def test_conformance_full() -> None:
    report = asyncio.run(validate(continuum_saver, progress=ProgressCallbacks.verbose()))
    report.print_report()
    assert report.conformance_level() == "FULL"
    base = ("put", "put_writes", "get_tuple", "list", "delete_thread")
    assert sum(report.results[name].tests_passed for name in base) == 58
    extended = ("delete_for_runs", "copy_thread", "prune")
    assert sum(report.results[name].tests_passed for name in extended) == 23
    assert sum(result.tests_failed for result in report.results.values()) == 0
