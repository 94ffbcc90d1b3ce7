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
    budgets = [] if body_ms is None else [body_ms]
    for name in DEADLINE_HEADERS:
        raw = headers.get(name)
        if raw is not None and not (name == ENVOY_HEADER and raw.strip() == "0"):  # Envoy: 0 = no timeout
            budgets.append(_header_ms(name, raw, max_ms))
    return min(budgets) if budgets else default_ms


def _header_ms(name: str, raw: str, max_ms: int) -> int:
    text = raw.strip()
    if not text.isdigit() or not 1 <= int(text) <= max_ms:
        shown = raw if len(raw) <= 40 else raw[:37] + "..."
        raise ApiError("invalid_request", f"header {name}: {shown!r} must be an integer number of "
                                          f"milliseconds between 1 and {max_ms}")
    return int(text)
