"""Shared fixtures of the continuum package's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import continuum


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A directory for one store (created by the store on open)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> Iterator[continuum.Store]:
    """An open store, closed after the test."""
    with continuum.Store(store_dir) as opened:
        yield opened
