"""One request's fate (live or simulated) and the record of a whole run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestResult:
    """One request's fate; times are milliseconds from the replay's t=0."""

    index: int
    route: str
    scheduled_ms: float
    sent_ms: float = float("nan")
    done_ms: float = float("nan")
    status: int = 0
    outcome: str = "not_sent"
    replica: int = 0
    """Which replica answered (its index among the replay's URLs; the last try's)."""
    tries: int = 1
    first_outcome: str | None = None
    """When retried: how the first try ended (its status, or client_timeout)."""
    first_done_ms: float = float("nan")
    """When retried: when the first try ended (ms from t=0)."""
    try_ms: float = float("nan")
    """The last try's send to its whole answer (or its end), by the high-resolution clock: the loop's
    clock, which every other time here is read from, moves in 1 ms steps under uvloop."""
    not_retried: str | None = None
    """Why a try that could have been retried was not (no time left, or Retry-After past the deadline)."""

    @property
    def latency_ms(self) -> float:
        return self.done_ms - self.scheduled_ms

    @property
    def lag_ms(self) -> float:
        return self.sent_ms - self.scheduled_ms

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("index", "route", "scheduled_ms", "sent_ms", "done_ms",
                                               "status", "outcome", "replica", "tries")}


@dataclass
class ReplayRun:
    """What a replay produced: per-request results and the server's metrics before and after."""

    results: list[RequestResult]
    window_s: float
    started_unix: float
    metrics_before: str | None = None
    metrics_after: str | None = None
    max_in_flight: int = 0
