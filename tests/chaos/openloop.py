"""Open-loop load for the chaos test: requests start on a fixed schedule, whatever came back before.

Every request is recorded with when it was sent and answered, its deadline, and what came back: a
status and error code, or the exception that replaced an answer (a reset, a refused connection).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

TEXTS = ["red running shoe", "blue phone case for summer", "cheap coffee", "the best hotel near me"]
HANG_MARGIN_S = 10.0  # client timeout beyond the deadline: reaching it means the request hung


@dataclass
class Outcome:
    """One request of the load: schedule, deadline and answer (status and code, or the exception)."""

    k: int
    sent: float
    deadline_ms: int
    answered: float = 0.0
    status: int = 0
    code: str = ""
    failure: str = ""
    """The exception instead of an HTTP answer (a reset, a refused connection, a client timeout)."""

    @property
    def waited_s(self) -> float:
        return self.answered - self.sent


class OpenLoop:
    """Sends `rate_per_s` scoring requests per second until stopped; `outcomes` grows as they end."""

    def __init__(self, session: aiohttp.ClientSession, url: str, rate_per_s: float, deadline_ms: int) -> None:
        self.session, self.url = session, url
        self.rate_per_s, self.deadline_ms = rate_per_s, deadline_ms
        self.outcomes: list[Outcome] = []
        self.sending = True
        self._pending: set[asyncio.Task[None]] = set()

    def answered_since(self, t: float, status: int = 200) -> int:
        return sum(1 for o in self.outcomes if o.answered and o.sent > t and o.status == status)

    async def run(self) -> None:
        """Launch requests on schedule until `sending` is cleared, then wait for all of them."""
        start, k = time.monotonic(), 0
        while self.sending:
            self._launch(k)
            k += 1
            await asyncio.sleep(max(0.0, start + k / self.rate_per_s - time.monotonic()))
        await asyncio.gather(*self._pending)

    def _launch(self, k: int) -> None:
        outcome = Outcome(k, time.monotonic(), self.deadline_ms)
        self.outcomes.append(outcome)
        task = asyncio.create_task(self._one(outcome))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _one(self, outcome: Outcome) -> None:
        samples = [f"{TEXTS[(outcome.k + i) % 4]} {outcome.k}" for i in range(1 + outcome.k % 3)]
        body = {"samples": samples, "labels": ["yes", "no"], "deadline_ms": outcome.deadline_ms}
        timeout = aiohttp.ClientTimeout(total=outcome.deadline_ms / 1000.0 + HANG_MARGIN_S)
        try:
            async with self.session.post(self.url + "/v1/score", json=body, timeout=timeout) as response:
                answer = await response.json(content_type=None)
                outcome.status = response.status
            outcome.code = "ok" if outcome.status == 200 else _error_code(answer)
            if outcome.status == 200 and len(answer.get("scores", ())) != len(samples):
                outcome.code = f"malformed answer: {answer}"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            outcome.failure = f"{type(exc).__name__}: {exc}"
        outcome.answered = time.monotonic()


def _error_code(answer: object) -> str:
    """The error's code when the body is a well-formed error, else a description of what it is."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and error.get("code") and error.get("message") and error.get("request_id"):
        return error["code"]
    return f"malformed error: {answer!r}"
