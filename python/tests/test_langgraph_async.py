"""The saver's `a`-methods run off the event loop: with every store call slowed down, a
ticker on the loop keeps ticking through each of them. `get_next_version` orders versions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

import continuum  # noqa: E402
from continuum.langgraph import ContinuumSaver  # noqa: E402

DELAY = 0.03


class SlowStore:
    """A store whose every call first sleeps ``DELAY`` seconds, blocking its thread."""

    def __init__(self, store: continuum.Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(DELAY)
            return method(*args, **kwargs)

        return call


async def _ticks_during(call: Callable[[], Awaitable[Any]]) -> int:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(DELAY / 10)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        result = call()
        if hasattr(result, "__aiter__"):
            [item async for item in result]
        else:
            await result
    finally:
        done.set()
        await task
    return ticks


def _checkpoint(step: int) -> dict:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"n": step}
    checkpoint["channel_versions"] = {"n": step + 1}
    return checkpoint


def test_every_async_method_leaves_the_event_loop_free(store: continuum.Store) -> None:
    saver = ContinuumSaver(SlowStore(store))  # type: ignore[arg-type]
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    async def scenario() -> dict[str, int]:
        first = await saver.aput(config, _checkpoint(0), {"run_id": "r0"}, {"n": 1})
        second = await saver.aput(first, _checkpoint(1), {"run_id": "r1"}, {"n": 2})
        calls: dict[str, Callable[[], Any]] = {
            "aput": lambda: saver.aput(second, _checkpoint(2), {"run_id": "r2"}, {"n": 3}),
            "aput_writes": lambda: saver.aput_writes(second, [("n", 5)], "task"),
            "aget_tuple": lambda: saver.aget_tuple(config),
            "alist": lambda: saver.alist(config),
            "acopy_thread": lambda: saver.acopy_thread("t", "copy"),
            "adelete_for_runs": lambda: saver.adelete_for_runs(["r0"]),
            "aprune": lambda: saver.aprune(["t"]),
            "adelete_thread": lambda: saver.adelete_thread("copy"),
        }
        return {name: await _ticks_during(call) for name, call in calls.items()}

    ticks = asyncio.run(scenario())
    assert all(count >= 3 for count in ticks.values()), ticks  # a blocked loop ticks once at most
    assert len(list(saver.list(config))) == 1
    assert list(saver.list({"configurable": {"thread_id": "copy"}})) == []


def test_get_next_version_increases(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    assert saver.get_next_version(None, None) == 1
    assert saver.get_next_version(7, None) == 8
    copied = "00000000000000000000000000000003.0.5712012345678901"
    following = saver.get_next_version(copied, None)
    assert isinstance(following, str) and following > copied
    assert following.startswith("00000000000000000000000000000004.")
