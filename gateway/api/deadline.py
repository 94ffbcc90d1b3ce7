"""A request's deadline budget: body `deadline_ms`, `X-Deadline-Ms`, Envoy's expected timeout.

The smallest of those given wins; with none, the route's default from config applies.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import ApiError

ENVOY_HEADER = "x-envoy-expected-rq-timeout-ms"
DEADLINE_HEADERS = ("X-Deadline-Ms", ENVOY_HEADER)


def resolve_deadline_ms(body_ms: int | None, headers: Mapping[str, str], default_ms: int, max_ms: int) -> int:
    """The budget in milliseconds from arrival; refuses a malformed header by name."""
    return budget_ms(body_ms, header_budget_ms(headers, max_ms), default_ms)


def header_budget_ms(headers: Mapping[str, str], max_ms: int) -> int | None:
    """The smallest budget the deadline headers give (None: none does); refuses a malformed one by name."""
    budgets = [_header_ms(name, raw, max_ms) for name in DEADLINE_HEADERS
               if (raw := headers.get(name)) is not None
               and not (name == ENVOY_HEADER and raw.strip() == "0")]  # Envoy: 0 = no timeout
    return min(budgets) if budgets else None


def budget_ms(body_ms: int | None, header_ms: int | None, default_ms: int) -> int:
    """The smallest of the body's and the headers' budgets, else the route's default."""
    given = [ms for ms in (body_ms, header_ms) if ms is not None]
    return min(given) if given else default_ms


def _header_ms(name: str, raw: str, max_ms: int) -> int:
    text = raw.strip()
    if not text.isdigit() or not 1 <= int(text) <= max_ms:
        shown = raw if len(raw) <= 40 else raw[:37] + "..."
        raise ApiError("invalid_request", f"header {name}: {shown!r} must be an integer number of "
                                          f"milliseconds between 1 and {max_ms}")
    return int(text)
