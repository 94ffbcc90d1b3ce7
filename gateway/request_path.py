"""The steps every scoring and beam request takes around its own work, written once.

A service (gateway/scoring.py, generation.py) tokenizes its request, checks it against the compiled
bounds, builds its jobs and writes its answer; around that, every request is the same:
  arrive   -> recorded as offered load (gateway/demand.py), prechecked by admission (refused before
              any tokenizing when even its smallest part would miss the deadline);
  tokenize -> timed as the "tokenize" stage;
  submit   -> its jobs queued by admission (429 / 503 when refused), timed as the "admission" stage;
  results  -> awaited, in order (gateway/request_end.py: the drops, lateness and waste counted).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.admission import Admission
from gateway.batcher import Batcher
from gateway.demand import Arrival
from gateway.job import Job
from gateway.metrics import Metrics
from gateway.request_end import RequestEnd


@dataclass
class Arrived:
    """One request on its path: when it arrived (the loop's clock, s), its budget and its offered load."""

    at: float
    budget_ms: float
    offered: Arrival
    tokenized_at: float | None = None


class RequestPath:
    """One workload's request path: its batcher, admission and metrics (see module docstring)."""

    def __init__(self, batcher: Batcher, admission: Admission, metrics: Metrics) -> None:
        self._batcher = batcher
        self._admission = admission
        self._metrics = metrics
        self._end = RequestEnd(batcher, metrics)
        self._loop = asyncio.get_running_loop()

    def arrive(self, request_id: str, deadline: float, items: int, priority: int) -> Arrived:
        """Record the arrival of a request of `items` samples or beams; refuse it if it cannot make its deadline."""
        at = self._loop.time()
        budget_ms = (deadline - at) * 1000.0
        offered = self._metrics.demand.arrive(at, self._batcher.workload, items, budget_ms)
        self._admission.precheck(self._batcher, request_id, deadline, at, items, priority)
        return Arrived(at, budget_ms, offered)

    def tokenized(self, request: Arrived, started: float, tokens_per_item: float | None = None) -> None:
        """The request's tokenizing, begun at `started` (the loop's clock), is done; `tokens_per_item`: its
        offered load's size, where the tokens alone tell it (else `run` is given it)."""
        request.tokenized_at = self._loop.time()
        request.offered.tokens_per_item = tokens_per_item
        self._metrics.observe_stage("tokenize", (request.tokenized_at - started) * 1000.0)

    def now(self) -> float:
        return self._loop.time()

    async def run(self, request: Arrived, jobs: list[Job], tokens_per_item: float | None = None) -> list[Any]:
        """Queue the request's jobs and await their results, in order (`tokens_per_item`: as in `tokenized`)."""
        if tokens_per_item is not None:
            request.offered.tokens_per_item = tokens_per_item
        now = request.tokenized_at if request.tokenized_at is not None else self._loop.time()
        self._admission.submit(self._batcher, jobs, now)
        self._metrics.observe_stage("admission", (self._loop.time() - now) * 1000.0)
        return await self._end.results(jobs, request.budget_ms)
