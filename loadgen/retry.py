"""Retrying on another replica: what a real upstream does with a refused or timed-out request.

A try that is refused (429 queue_full, 503 deadline_unmeetable and the other 503s), answered 504
(the gateway's own deadline_exceeded) or not answered within its per-try timeout is sent once more,
to the next replica, with what is left of the request's deadline (counted from its scheduled send,
as every latency of the replayer is) in `X-Deadline-Ms`: the gateway takes the smallest budget it is
given (gateway/api/deadline.py), so the body's own `deadline_ms` cannot stretch it.

Retry-After is honoured the way Envoy's rate-limited retry back-off honours it: the retry leaves no
sooner than the refusal said. When that wait, or the time the first answer took, leaves less than
`min_left_ms` of the deadline, the request is not retried: a retry past its deadline is work nobody
waits for. The gateway writes Retry-After in whole seconds (HTTP's delay-seconds, at least 1), so a
429 of a request due in under a second is never retried.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

RETRY_STATUSES = frozenset({429, 503, 504})
"""Answers a retry is made for: refused (429, 503) or timed out at the gateway (504)."""
TIMED_OUT = "client_timeout"
"""The outcome of a try the client gave up on (loadgen/replayer.py)."""


@dataclass(frozen=True)
class RetryOptions:
    """How a replay retries (loadgen/replayer.py: requests spread round-robin over the replicas)."""

    first_try_timeout_share: float | None = None
    """The first try is given up (its connection closed: the gateway takes its queued work out) after
    this share of the request's deadline and retried with the rest; None: the first try waits for its
    answer, and only refusals and the gateway's 504s are retried."""
    min_left_ms: float = 1.0
    """The least budget a retry is sent with (milliseconds); with less left, the first answer stands."""

    def __post_init__(self) -> None:
        share = self.first_try_timeout_share
        if share is not None and not 0.0 < share < 1.0:
            raise ValueError(f"first_try_timeout_share must be in (0, 1): a share of the deadline; got {share}")
        if not self.min_left_ms >= 1.0:
            raise ValueError(f"min_left_ms must be at least 1 (X-Deadline-Ms is whole milliseconds); "
                             f"got {self.min_left_ms}")


def is_retried(status: int, outcome: str) -> bool:
    """Whether a first try that ended so is retried (when time is left)."""
    return status in RETRY_STATUSES or outcome == TIMED_OUT


def retry_after_s(headers: Mapping[str, str], now_unix: float | None = None) -> float:
    """Seconds Retry-After asks to wait (delay-seconds or an HTTP-date; 0 when absent or malformed)."""
    raw = headers.get("retry-after", "").strip()
    if not raw:
        return 0.0
    if raw.isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - (time.time() if now_unix is None else now_unix))


def retry_budget_ms(deadline_ms: float, scheduled_ms: float, retry_at_ms: float) -> int:
    """Whole milliseconds left of the deadline when the retry leaves at `retry_at_ms` (all times
    from the replay's t=0), rounded down so that the retry never asks for more than is left."""
    return math.floor(deadline_ms - (retry_at_ms - scheduled_ms))
