"""The native trace: one request per JSON line, read and written with line-numbered validation.

A line is a JSON object:
  t_ms        send time in milliseconds from the start of the trace (required, >= 0)
  route       "score" (POST /v1/score) or "generate" (POST /v1/generate) (required)
  deadline_ms optional per-request deadline budget; absent means the route default of the gateway
  and then either the whole request
  body        the exact JSON body to send
  or only its lengths, from which a body is synthesised at replay time (loadgen/bodies.py):
  sample_tokens         score: tokens of each sample, e.g. [120, 97, 130] (3 samples)
    (or samples + tokens_per_sample as shorthand for equal samples)
  prompt_tokens         generate: tokens of the prompt
  beam_width, max_new_tokens, num_return_sequences   generate: optional, replay defaults otherwise
  group         optional burst id (requests an upstream split from one query)
  prefix_tokens score: leading tokens all its samples share (a context before the items)
  context       score, with prefix_tokens: optional id (integer >= 0) of that context; lines with the
                same context send the same prefix tokens, so a replay repeats contexts as users do
  output_tokens optional, informational (the generated length an imported trace recorded)
A line {"meta": {...}} anywhere holds free-form facts about the trace (its source, parameters).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.prefix import longest_common_prefix

ROUTES = ("score", "generate")
PATHS = {"score": "/v1/score", "generate": "/v1/generate"}
TEXT_CHARS_PER_TOKEN = 4.0
"""Estimate used only when a body holds text and no tokenizer is given (simulator input sizes)."""


class TraceError(ValueError):
    """A trace line is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRecord:
    """One request of a trace: when to send it, where, and its body or its token lengths."""

    t_ms: float
    route: str
    sample_tokens: tuple[int, ...] = ()
    prompt_tokens: int = 0
    beam_width: int | None = None
    max_new_tokens: int | None = None
    num_return_sequences: int | None = None
    deadline_ms: float | None = None
    body: dict[str, Any] | None = None
    group: int | None = None
    output_tokens: int | None = None
    prefix_tokens: int = 0
    """score: how many leading tokens all its samples have in common (a context before the items);
    the gateway and the simulator share them by the same rule (shared/prefix.SharingRule)."""
    context: int | None = None
    """score: which context the shared prefix is; records with the same context (and prefix_tokens)
    send the same prefix tokens (loadgen/bodies.py), as repeated contexts of one user or query."""
    priority: int = 0
    """The request's priority (larger is more important; the gateway's `priority` field)."""

    def shape(self, default_beam_width: int = 1) -> tuple[int, float]:
        """(B, L) for the latency model: score B = samples, L = mean tokens per sample;
        generate B = beams, L = prompt tokens (shared/latency_model.py's convention)."""
        if self.route == "score":
            lengths = self.sample_tokens or _body_sample_lengths(self.body)
            return len(lengths), (sum(lengths) / len(lengths) if lengths else 0.0)
        beams = self.beam_width or _body_int(self.body, "beam_width") or default_beam_width
        prompt = self.prompt_tokens or _body_prompt_length(self.body)
        return beams, float(prompt)

    def common_prefix_tokens(self) -> int:
        """The samples' common leading tokens: prefix_tokens, or what a body's token-id samples share."""
        if self.prefix_tokens or self.body is None:
            return self.prefix_tokens
        samples = self.body.get("samples", [])
        ids = [s["input_ids"] for s in samples if isinstance(s, dict) and isinstance(s.get("input_ids"), list)]
        return longest_common_prefix(ids) if ids and len(ids) == len(samples) else 0

    def total_tokens(self) -> int:
        """Input tokens this request adds to a queue (the gateway's token budget counts these)."""
        size, mean = self.shape()
        return int(round(mean * (size if self.route == "score" else 1)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t_ms": round(self.t_ms, 3), "route": self.route}
        for name in ("deadline_ms", "beam_width", "max_new_tokens", "num_return_sequences",
                     "group", "output_tokens", "context", "body"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.sample_tokens:
            out["sample_tokens"] = list(self.sample_tokens)
        if self.prompt_tokens:
            out["prompt_tokens"] = self.prompt_tokens
        if self.prefix_tokens:
            out["prefix_tokens"] = self.prefix_tokens
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Trace:
    """Records sorted by send time, plus free-form metadata."""

    records: tuple[TraceRecord, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def duration_ms(self) -> float:
        return self.records[-1].t_ms - self.records[0].t_ms if self.records else 0.0

    def rate_rps(self) -> float:
        """Mean offered rate: requests per second over the span (n-1 gaps)."""
        span = self.duration_ms()
        return (len(self.records) - 1) / (span / 1000.0) if span > 0 else 0.0

    def window(self, start_ms: float, length_ms: float) -> Trace:
        """The records sent in [start_ms, start_ms + length_ms), shifted to start at 0."""
        kept = [r for r in self.records if start_ms <= r.t_ms < start_ms + length_ms]
        return Trace(tuple(_shift(r, -start_ms) for r in kept), dict(self.meta))

    def scaled(self, speed: float) -> Trace:
        """Send times divided by `speed` (2.0 sends twice as fast)."""
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        records = tuple(_replace_t(r, r.t_ms / speed) for r in self.records)
        return Trace(records, {**self.meta, "speed": speed * self.meta.get("speed", 1.0)})


def make_trace(records: Iterable[TraceRecord], meta: dict[str, Any] | None = None) -> Trace:
    return Trace(tuple(sorted(records, key=lambda r: r.t_ms)), dict(meta or {}))


def read_trace(path: str | Path) -> Trace:
    """Read a JSON-lines trace; every problem names its line."""
    path = Path(path)
    records, meta = [], {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if isinstance(raw, dict) and set(raw) == {"meta"}:
                if not isinstance(raw["meta"], dict):
                    raise TraceError(f"meta must be a JSON object, got {type(raw['meta']).__name__}")
                meta.update(raw["meta"])
                continue
            records.append(parse_record(raw))
        except (json.JSONDecodeError, TraceError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{number}: {exc}") from None
    if not records:
        raise TraceError(f"{path}: no requests in the trace")
    return make_trace(records, meta)


def write_trace(trace: Trace, path: str | Path) -> None:
    lines = [json.dumps({"meta": trace.meta})] if trace.meta else []
    lines += [json.dumps(r.to_json(), separators=(",", ":")) for r in trace.records]
    Path(path).write_text("\n".join(lines) + "\n")


def parse_record(raw: Any) -> TraceRecord:
    """Validate one decoded line into a TraceRecord."""
    if not isinstance(raw, dict):
        raise TraceError(f"a trace line must be a JSON object, got {type(raw).__name__}")
    known = {"t_ms", "route", "sample_tokens", "samples", "tokens_per_sample", "prompt_tokens",
             "beam_width", "max_new_tokens", "num_return_sequences", "deadline_ms", "body",
             "group", "output_tokens", "prefix_tokens", "context", "priority"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TraceError(f"unknown field(s) {unknown}; known: {sorted(known)}")
    t_ms = _number(raw, "t_ms", required=True)
    route = raw.get("route")
    if route not in ROUTES:
        raise TraceError(f"route must be one of {ROUTES}, got {route!r}")
    body = raw.get("body")
    if body is not None and not isinstance(body, dict):
        raise TraceError("body must be a JSON object")
    samples = _sample_tokens(raw)
    prompt = _int(raw, "prompt_tokens") or 0
    if body is None and route == "score" and not samples:
        raise TraceError("a score line needs body, sample_tokens, or samples + tokens_per_sample")
    if body is None and route == "generate" and prompt < 1:
        raise TraceError("a generate line needs body or prompt_tokens >= 1")
    prefix = _int(raw, "prefix_tokens", low=0) or 0
    if prefix and (route != "score" or not samples or prefix > min(samples)):
        raise TraceError(f"prefix_tokens = {prefix} needs a score line whose every sample is at least that long")
    context = _int(raw, "context", low=0)
    if context is not None and not prefix:
        raise TraceError(f"context = {context} names a shared prefix: the line needs prefix_tokens >= 1")
    return TraceRecord(
        t_ms=t_ms, route=route, sample_tokens=samples, prompt_tokens=prompt,
        beam_width=_int(raw, "beam_width"), max_new_tokens=_int(raw, "max_new_tokens"),
        num_return_sequences=_int(raw, "num_return_sequences"),
        deadline_ms=_deadline(raw), body=body,
        group=_int(raw, "group", low=0), output_tokens=_int(raw, "output_tokens", low=0), prefix_tokens=prefix,
        context=context, priority=_priority(raw),
    )


def _priority(raw: dict[str, Any]) -> int:
    value = raw.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"priority must be an integer, got {value!r}")
    return value


def _sample_tokens(raw: dict[str, Any]) -> tuple[int, ...]:
    if "sample_tokens" in raw:
        values = raw["sample_tokens"]
        if not isinstance(values, list) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values
        ):
            raise TraceError("sample_tokens must be a non-empty list of integers >= 1")
        return tuple(values)
    if "samples" in raw or "tokens_per_sample" in raw:
        count, length = _int(raw, "samples"), _int(raw, "tokens_per_sample")
        if count is None or length is None:
            raise TraceError("samples and tokens_per_sample go together")
        return (length,) * count
    return ()


def _deadline(raw: dict[str, Any]) -> float | None:
    """deadline_ms, at least the gateway's shortest (1 ms; bodies carry it rounded to whole ms)."""
    value = _number(raw, "deadline_ms")
    if value is not None and value < 1:
        raise TraceError(f"deadline_ms must be at least 1 (ms, the gateway's shortest deadline), got {value!r}")
    return value


def _number(raw: dict[str, Any], name: str, required: bool = False) -> float | None:
    value = raw.get(name)
    if value is None:
        if required:
            raise TraceError(f"missing {name}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TraceError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def _int(raw: dict[str, Any], name: str, low: int = 1) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraceError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _body_int(body: dict[str, Any] | None, name: str) -> int | None:
    value = (body or {}).get(name)
    return value if isinstance(value, int) else None


def _text_len(item: Any) -> int:
    if isinstance(item, dict) and isinstance(item.get("input_ids"), list):
        return len(item["input_ids"])
    return max(1, round(len(str(item)) / TEXT_CHARS_PER_TOKEN))


def _body_sample_lengths(body: dict[str, Any] | None) -> list[int]:
    return [_text_len(s) for s in (body or {}).get("samples", [])]


def _body_prompt_length(body: dict[str, Any] | None) -> int:
    body = body or {}
    if isinstance(body.get("input_ids"), list):
        return len(body["input_ids"])
    return _text_len(body.get("prompt", ""))


def _replace_t(record: TraceRecord, t_ms: float) -> TraceRecord:
    return TraceRecord(**{**record.__dict__, "t_ms": t_ms})


def _shift(record: TraceRecord, delta_ms: float) -> TraceRecord:
    return _replace_t(record, record.t_ms + delta_ms)
