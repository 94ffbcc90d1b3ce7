"""Rules across the fields of the standard routes' bodies (gateway/api/compat_types.py), in the form
of gateway/api/rules.py: the decoder checks them, /openapi.json states them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.rules import Schema


def input_kind(item: Any) -> str:
    """text | token id | token ids: the kind of one item of OpenAI's `input` list."""
    return "text" if isinstance(item, str) else "token id" if isinstance(item, int) else "token ids"


@dataclass(frozen=True)
class InputsOfOneKind:
    """OpenAI's embeddings `input` list: all texts, all token ids (one input) or all token id lists."""

    name: str = "one_kind:input"
    says: str = "input's items are all texts, all token ids (one input) or all token id lists"

    def broken(self, body: Any, where: str) -> str | None:
        if isinstance(body.input, str):
            return None
        first = input_kind(body.input[0])
        for index, item in enumerate(body.input):
            if input_kind(item) != first:
                return (f"{where}.input[{index}] is {input_kind(item)} but {where}.input[0] is {first}: give a list "
                        "of texts, a list of token ids, or a list of token id lists")
        return None

    def schema(self) -> Schema:
        kinds = [{"type": "string"}, {"type": "integer"}, {"type": "array"}]
        return {"properties": {"input": {"anyOf": [{"type": "string"}] + [
            {"type": "array", "items": kind} for kind in kinds]}}}
