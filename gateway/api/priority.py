"""A request's priority: the body's `priority` or the `X-Priority` header (they must agree), else 0.

Larger is more important (SGLang's and vLLM's sense): under overload lower priorities are refused or
shed first, and within a priority deadlines order the queue (shared/policy/deadline_queue.py). The
deployment bounds it ([gateway] min_priority, max_priority); outside them a request gets 400.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import ApiError

PRIORITY_HEADER = "X-Priority"
DEFAULT_PRIORITY = 0


def resolve_priority(body: int | None, headers: Mapping[str, str], least: int, most: int) -> int:
    """The request's priority; refuses a malformed or out-of-range header, or one the body contradicts.
    (The body's field is range-checked by its declared limits: gateway/api/types.py, limit_check.py.)"""
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return DEFAULT_PRIORITY if body is None else body
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit() or not least <= int(text) <= most:
        shown = raw if len(raw) <= 40 else raw[:37] + "..."
        raise ApiError("invalid_request", f"header {PRIORITY_HEADER}: {shown!r} must be an integer between {least} "
                                          f"and {most} (larger is more important)")
    if body is not None and body != int(text):
        raise ApiError("invalid_request", f"priority is {body} in the body and {int(text)} in {PRIORITY_HEADER}; "
                                          "give one, or the same in both")
    return int(text)
