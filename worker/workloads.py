"""The worker's wiring, declared once: for each workload it serves, the batch it takes, the check
that runs on receipt, the runner that computes it and the result types it answers with.

A request's path through a worker reads down this table: worker/server.py decodes a batch and
calls its workload's `check` (worker/bounds_check.py), worker/compute.py hands the live requests
to its `runner` (worker/runner.py) and wraps their answers in its `reply_type` message, and
worker/profiler.py times the same runner on synthetic batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from shared.bounds import Bounds
from shared.protocol import BeamBatch, BeamResult, BeamResults, ScoreBatch, ScoreResult, ScoreResults
from worker.bounds_check import check_beam_batch, check_score_batch

WorkloadName = Literal["score", "beam"]
Batch = ScoreBatch | BeamBatch
Result = ScoreResult | BeamResult


class Runner(Protocol):
    """Computes a batch's live requests on a lane: {request index: its result}."""

    def run(self, batch: Batch, live: Sequence[int], lane) -> dict[int, Result]: ...


@dataclass(frozen=True)
class Workload:
    """One workload a worker serves."""

    name: WorkloadName
    batch: type[ScoreBatch] | type[BeamBatch]
    check: Callable[[Batch], dict[int, str]]
    """On receipt: {request index: why it alone is refused}; raises BatchRefused for the whole batch."""
    runner: Runner
    reply_type: type[ScoreResults] | type[BeamResults]
    """The answer to one batch."""
    result_type: type[ScoreResult] | type[BeamResult]
    """One request's answer inside it (also for an expired or refused request)."""


@dataclass(frozen=True)
class Workloads:
    """The workloads one worker serves, looked up by name or by the batch message that carries them."""

    served: tuple[Workload, ...]

    def names(self) -> tuple[WorkloadName, ...]:
        return tuple(w.name for w in self.served)

    def for_batch(self, batch: object) -> Workload | None:
        """The workload of a decoded batch message (None: a batch this worker does not serve)."""
        return next((w for w in self.served if isinstance(batch, w.batch)), None)

    def get(self, name: str) -> Workload | None:
        return next((w for w in self.served if w.name == name), None)


def workloads_of(score_runner: Runner | None, beam_runner: Runner | None, bounds: Bounds,
                 vocab_size: int) -> Workloads:
    """The table for the nodes one artifacts folder holds (a None runner: that node is absent)."""
    served = []
    if score_runner is not None:
        served.append(Workload("score", ScoreBatch,
                               functools.partial(check_score_batch, bounds=bounds, vocab_size=vocab_size),
                               score_runner, ScoreResults, ScoreResult))
    if beam_runner is not None:
        served.append(Workload("beam", BeamBatch,
                               functools.partial(check_beam_batch, bounds=bounds, vocab_size=vocab_size),
                               beam_runner, BeamResults, BeamResult))
    return Workloads(tuple(served))
