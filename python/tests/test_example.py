"""`python/examples/approval_agent.py` runs as the README shows: the first process stops at
the approval question, the second reopens the store, resumes with the answer and books."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("langgraph")

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "approval_agent.py"


def test_approval_agent_stops_then_resumes_in_another_process(store_dir: pathlib.Path) -> None:
    first = subprocess.run([sys.executable, str(EXAMPLE), str(store_dir)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "waiting for approval" in first.stdout
    assert "booked" not in first.stdout
    second = subprocess.run([sys.executable, str(EXAMPLE), str(store_dir), "--answer", "yes"],
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "booked LH123, confirmation K7Q2" in second.stdout
    assert "waiting for approval" not in second.stdout
