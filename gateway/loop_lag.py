"""The event loop's present lag, sampled for the batchers' learnt lateness.

A timer due every TICK_S measures how late it fires: in a burst of arrivals the loop runs late
(HTTP, JSON, tokenizing, admission on one core), and every answer on its way back waits as long.
Each sample goes to each batcher's `Lateness.lag` (shared/policy/admission.py: `PresentLag`, which
forgets it within a few hundred ms), so the slack of drops and refusals follows the lag of now, not
the last burst's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shared.policy import PresentLag

TICK_S = 0.005
"""200 timers a second: a few µs each, and a lag shorter than this is within the model's error."""


class LoopLagWatch:
    """Samples the running loop's lag into `lags` every TICK_S until stopped."""

    def __init__(self, lags: Sequence[PresentLag], tick_s: float = TICK_S) -> None:
        self._lags = tuple(lags)
        self._tick_s = tick_s
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        self._due = self._loop.time() + self._tick_s
        self._timer = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        now = self._loop.time()
        lag_ms = max(0.0, now - self._due) * 1000.0
        for lag in self._lags:
            lag.sample(now, lag_ms)
        self._due = now + self._tick_s
        self._timer = self._loop.call_at(self._due, self._tick)
