"""W3C trace context (https://www.w3.org/TR/trace-context/): a caller's `traceparent` read, ours
written, new ids, and the sampling decision for a request ([telemetry] sample_ratio, parent-based).

Plain integers and strings, nothing of OpenTelemetry: this runs on the event loop for every request
while tracing is on, so it stays a few attribute reads and one random draw."""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from dataclasses import dataclass

SAMPLED = 0x01
"""The trace-flags bit that says the caller records this trace."""
_HEX = frozenset(string.hexdigits.lower())
_ID_RANDOM = random.Random()
"""Span and trace ids: 64 and 128 random bits, as the OpenTelemetry SDK's RandomIdGenerator draws
them (not for secrets; a generator of our own so a test's seeding of `random` cannot repeat ids)."""


@dataclass(frozen=True, slots=True)
class CallerContext:
    """The span a caller's `traceparent` names: its trace, its span (our request span's parent), and
    whether the caller samples the trace; `tracestate`: the header as sent (vendors' entries), or ""."""

    trace_id: int
    span_id: int
    sampled: bool
    tracestate: str = ""


def _hex_id(text: str, digits: int) -> int | None:
    """`digits` lowercase hex digits as an int, None when malformed or all zeros (invalid ids)."""
    if len(text) != digits or not _HEX.issuperset(text):
        return None
    return int(text, 16) or None


def caller_context(headers: Mapping[str, str]) -> CallerContext | None:
    """The caller's context from its headers (aiohttp's are case-insensitive), None when there is no
    `traceparent` or it is malformed: the W3C rule is to start a new trace then, not to refuse."""
    value = headers.get("traceparent")
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or not _HEX.issuperset(parts[0]):
        return None
    if parts[0] == "00" and len(parts) != 4:  # version 00 has exactly four fields; later ones may add more
        return None
    trace_id, span_id = _hex_id(parts[1], 32), _hex_id(parts[2], 16)
    if trace_id is None or span_id is None or len(parts[3]) != 2 or not _HEX.issuperset(parts[3]):
        return None
    return CallerContext(trace_id, span_id, bool(int(parts[3], 16) & SAMPLED), headers.get("tracestate", ""))


def traceparent(trace_id: int, span_id: int) -> str:
    """A sampled span's W3C traceparent: version 00, trace id, span id, flags 01."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def new_span_id() -> int:
    return _ID_RANDOM.getrandbits(64) or 1


def new_trace_id() -> int:
    return _ID_RANDOM.getrandbits(128) or 1


class RatioSampler:
    """Parent-based ratio sampling, OpenTelemetry's `ParentBased(TraceIdRatioBased(ratio))`: a request
    whose caller sent a traceparent follows the caller's sampled flag (a trace is kept or dropped
    whole across services); one that starts a trace keeps it when the low 64 bits of its trace id
    fall under `ratio` × 2^64, the same rule as the SDK's, so any service applying that ratio to the
    same trace id decides alike."""

    def __init__(self, ratio: float) -> None:
        """`ratio` in [0, 1]: the share of new traces kept (1: all, 0: only callers' sampled ones)."""
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sample ratio {ratio} must be in [0, 1]")
        self.ratio = ratio
        self._bound = round(ratio * (1 << 64))

    def sampled(self, trace_id: int, caller: CallerContext | None) -> bool:
        if caller is not None:
            return caller.sampled
        return (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < self._bound
