"""Explicit synchronisation for the gateway tests: wait for a state, never for a length of time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "the condition") -> None:
    """Return once `condition()` holds (polled); fail if it has not after `timeout_s`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not condition():
        assert loop.time() < end, f"{what} never held within {timeout_s} s"
        await asyncio.sleep(0.005)
