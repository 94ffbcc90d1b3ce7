"""POST /v1/generate bodies (bounded beam search), parsed into a GenerateSpec.

{"prompt": str | "input_ids": [int], "beam_width", "max_new_tokens", "num_return_sequences",
 "constraints", "deadline_ms"}. Beam width and steps above the compiled bounds get 413.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway import fields as f
from gateway.errors import ApiError
from gateway.limits import Limits

FIELDS = ("prompt", "input_ids", "beam_width", "max_new_tokens", "num_return_sequences",
          "constraints", "deadline_ms")
DEFAULT_BEAM_WIDTH = 4


@dataclass(frozen=True)
class GenerateSpec:
    """A validated beam-search request, before tokenization."""

    prompt: str | list[int]
    beam_width: int
    max_new_tokens: int
    num_return_sequences: int
    deadline_ms: int | None


def parse_generate(body: Any, limits: Limits) -> GenerateSpec:
    """Validate a /v1/generate body; raises ApiError naming the field."""
    if not limits.beam_enabled:
        raise ApiError("not_found", "this deployment serves no beam search (beam.enabled is false in its config, "
                                    "or its artifacts hold no beam node)")
    body = f.require_object(body, "the request body")
    f.reject_unknown(body, FIELDS, "the request body")
    prompt = _prompt(body, limits)
    beam_width = f.get_bounded(body, "beam_width", limits.max_beam_width,
                               min(DEFAULT_BEAM_WIDTH, limits.max_beam_width), "beams")
    max_new_tokens = f.get_bounded(body, "max_new_tokens", limits.max_new_tokens, limits.max_new_tokens,
                                   "decode steps")
    num_return = f.get_bounded(body, "num_return_sequences", limits.max_beam_width, 1, "beams")
    if num_return > beam_width:
        raise f.invalid(f"num_return_sequences = {num_return} must not exceed beam_width = {beam_width}")
    _constraints(body, limits)
    deadline_ms = f.get_int(body, "deadline_ms", 1, limits.max_deadline_ms, None)
    return GenerateSpec(prompt, beam_width, max_new_tokens, num_return, deadline_ms)


def _prompt(body: dict[str, Any], limits: Limits) -> str | list[int]:
    has_prompt, has_ids = body.get("prompt") is not None, body.get("input_ids") is not None
    if has_prompt == has_ids:
        raise f.invalid("give exactly one of prompt (a string) or input_ids (a list of token ids)")
    if has_ids:
        ids = f.token_ids(body["input_ids"], "input_ids", limits.vocab_size)
        if len(ids) > limits.max_prompt_tokens:
            raise ApiError("too_large", f"input_ids holds {len(ids)} tokens; the compiled bound is "
                                        f"{limits.max_prompt_tokens} prompt tokens")
        return ids
    prompt = f.get_str(body, "prompt", max_len=1 << 20)
    if not prompt:
        raise f.invalid("prompt is empty; it needs at least one token")
    return prompt


def _constraints(body: dict[str, Any], limits: Limits) -> None:
    name = body.get("constraints")
    if name is None:
        return
    if limits.constraints is None:
        raise f.invalid("constraints: this deployment has no constraint set; remove the field")
    if name != limits.constraints:
        raise f.invalid(f"constraints = {f.short(name)}: this deployment's only constraint set is "
                        f"{limits.constraints!r}")
