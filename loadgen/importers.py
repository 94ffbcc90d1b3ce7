"""Importers from public production traces into the native trace (loadgen/trace.py).

Columns used, and how (all other columns are ignored):
  azure     Azure LLM inference trace CSV `TIMESTAMP,ContextTokens,GeneratedTokens`
            TIMESTAMP (ISO date-time, or seconds) -> send time; ContextTokens -> input tokens;
            GeneratedTokens -> output tokens.
  burstgpt  BurstGPT CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`
            Timestamp (seconds) -> send time; Request tokens -> input; Response tokens -> output.
  mooncake  Mooncake JSON lines (or CSV) `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
            timestamp -> send time; input_length -> input; output_length -> output. hash_ids name
            shared prefix blocks; boundserve keeps no cross-request prefix cache, so they are unused.
Send times are made relative to the earliest row (t_ms = 0) and sorted.

Input tokens become request shapes as follows:
  score     the input tokens are split into `samples_per_request` samples of near-equal length
            (never more samples than tokens); each sample is clipped to `max_tokens_per_sample`.
  generate  prompt_tokens = input tokens clipped to `max_prompt_tokens`; max_new_tokens = output
            tokens clamped to [1, max_new_tokens]; beam_width as given (or the replay default).
  mix       each row is score with probability `score_fraction` (seeded), generate otherwise.
Clipping is counted in the returned trace's meta ("clipped_rows") and printed by the CLI: nothing
is shortened silently. The original output length is kept in `output_tokens`.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from loadgen.trace import Trace, TraceError, TraceRecord, make_trace

FORMATS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens", 1000.0),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens", 1000.0),
    "mooncake": ("timestamp", "input_length", "output_length", 1.0),
}
"""format -> (time column, input-token column, output-token column, milliseconds per time unit)."""


@dataclass(frozen=True)
class ImportOptions:
    """How rows of lengths become boundserve requests."""

    route: str = "score"
    """score | generate | mix"""
    score_fraction: float = 0.5
    samples_per_request: int = 15
    max_tokens_per_sample: int = 512
    max_prompt_tokens: int = 512
    max_new_tokens: int = 4
    beam_width: int | None = None
    limit: int | None = None
    """Keep at most this many rows (after sorting by time)."""
    seed: int = 0

    def validate(self) -> None:
        if self.route not in ("score", "generate", "mix"):
            raise ValueError(f"route must be score, generate or mix, got {self.route!r}")
        if not 0.0 <= self.score_fraction <= 1.0:
            raise ValueError(f"score_fraction must be in [0, 1], got {self.score_fraction}")
        for name in ("samples_per_request", "max_tokens_per_sample", "max_prompt_tokens", "max_new_tokens",
                     "beam_width", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


def import_trace(path: str | Path, fmt: str, options: ImportOptions = ImportOptions()) -> Trace:
    """Read a public trace file of format `fmt` into a native Trace."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    options.validate()
    time_col, in_col, out_col, ms_per_unit = FORMATS[fmt]
    rows = []
    for number, row in _rows(Path(path)):
        try:
            when = _time_ms(row[time_col], ms_per_unit)
            rows.append((when, _count(row[in_col], in_col), _count(row[out_col], out_col)))
        except KeyError as exc:
            raise TraceError(f"{path}:{number}: missing column {exc}; {fmt} needs "
                             f"{time_col!r}, {in_col!r}, {out_col!r}") from None
        except ValueError as exc:
            raise TraceError(f"{path}:{number}: {exc}") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    rows.sort(key=lambda r: r[0])
    rows = rows if options.limit is None else rows[: options.limit]
    start = rows[0][0]
    rng = random.Random(options.seed)
    records, clipped = [], 0
    for when, tokens_in, tokens_out in rows:
        record, was_clipped = _to_record(when - start, tokens_in, tokens_out, options, rng)
        records.append(record)
        clipped += was_clipped
    meta = {"source": str(path), "format": fmt, "rows": len(rows), "clipped_rows": clipped,
            "columns_used": [time_col, in_col, out_col], "route": options.route}
    return make_trace(records, meta)


def split_tokens(total: int, samples: int, max_per_sample: int) -> tuple[tuple[int, ...], bool]:
    """`total` tokens into min(samples, total) near-equal samples, each clipped to max_per_sample."""
    count = max(1, min(samples, total))
    base, extra = divmod(max(total, 1), count)
    lengths = [base + (1 if i < extra else 0) for i in range(count)]
    clipped = any(n > max_per_sample for n in lengths)
    return tuple(min(n, max_per_sample) for n in lengths), clipped


def _to_record(t_ms: float, tokens_in: int, tokens_out: int, options: ImportOptions,
               rng: random.Random) -> tuple[TraceRecord, bool]:
    route = options.route
    if route == "mix":
        route = "score" if rng.random() < options.score_fraction else "generate"
    if route == "score":
        lengths, clipped = split_tokens(tokens_in, options.samples_per_request, options.max_tokens_per_sample)
        return TraceRecord(t_ms=t_ms, route="score", sample_tokens=lengths, output_tokens=tokens_out), clipped
    prompt = max(1, min(tokens_in, options.max_prompt_tokens))
    record = TraceRecord(
        t_ms=t_ms, route="generate", prompt_tokens=prompt, beam_width=options.beam_width,
        max_new_tokens=max(1, min(tokens_out, options.max_new_tokens)), output_tokens=tokens_out,
    )
    return record, tokens_in > options.max_prompt_tokens


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) from a CSV with a header, or from JSON lines."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    first = text.lstrip()[:1]
    if first == "{":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{number}: not JSON: {exc}") from None
        return
    reader = csv.DictReader(text.splitlines(), skipinitialspace=True)
    for number, row in enumerate(reader, 2):
        yield number, {(k or "").strip(): v for k, v in row.items()}


def _time_ms(value: object, ms_per_unit: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) * ms_per_unit
    text = str(value).strip()
    try:
        return float(text) * ms_per_unit
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp() * 1000.0
    except ValueError:
        raise ValueError(f"time {text!r} is neither a number nor an ISO date-time") from None


def _count(value: object, column: str) -> int:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ValueError(f"{column} = {value!r} is not a number") from None
    if number < 0 or number != int(number):
        raise ValueError(f"{column} = {value!r} must be a whole number >= 0")
    return int(number)
