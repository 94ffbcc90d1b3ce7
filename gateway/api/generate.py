"""POST /v1/generate bodies (bounded beam search), parsed into a GenerateSpec.

{"prompt": str | "input_ids": [int], "beam_width", "max_new_tokens", "num_return_sequences",
 "constraints", "deadline_ms"}, declared in gateway/api/types.py and decoded by msgspec
(gateway/api/decoding.py). Beam width and steps above the compiled bounds get 413.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.decoding import BodyDecoder
from gateway.errors import ApiError
from gateway.api.types import DEFAULT_BEAM_WIDTH, GenerateRequest
from gateway.limits import Limits


@dataclass(frozen=True)
class GenerateSpec:
    """A validated beam-search request, before tokenization."""

    prompt: str | list[int]
    beam_width: int
    max_new_tokens: int
    num_return_sequences: int
    deadline_ms: int | None
    priority: int | None = None
    """The body's priority (None: not given)."""
    catalog: str = ""
    """The loaded catalogue to decode in ("": the default one)."""


def parse_generate(raw: bytes, limits: Limits) -> GenerateSpec:
    """Decode a /v1/generate body; raises ApiError (400/404/413) naming the field."""
    if not limits.beam_enabled:
        raise ApiError("not_found", "this deployment serves no beam search (beam.enabled is false in its config, "
                                    "or its artifacts hold no beam node)")
    return DECODER.decode(raw, limits)


def _spec(body: Any, limits: Limits) -> GenerateSpec:
    """The spec of a body that met its type, its limits and its rules, defaults filled in."""
    beam_width = body.beam_width or min(DEFAULT_BEAM_WIDTH, limits.bounds.max_beam_width)
    num_return = body.num_return_sequences or 1
    prompt = body.prompt if body.input_ids is None else body.input_ids
    return GenerateSpec(prompt, beam_width, body.max_new_tokens or limits.bounds.max_new_tokens, num_return,
                        body.deadline_ms, body.priority, body.catalog or "")


DECODER = BodyDecoder(GenerateRequest, _spec)
