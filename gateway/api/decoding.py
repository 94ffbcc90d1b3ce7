"""Decoding a JSON request body into its declared type (gateway/api/types.py), and the answer when
it does not fit: 400 invalid_request or 413 too_large, naming the field path and the fix.

msgspec validates while it parses, at C speed, and stops at the first problem with its path
(`$.samples[3].input_ids[0]`). A body is decoded against its type with the compiled bounds; only
when that fails is it decoded again without them, which tells a malformed body from one over a
compiled bound. Order of answers: a malformed field (400), then a rule across fields (400), then a
compiled bound exceeded (413). The message is written from the type at that path (its limits, its
413 text) and the value the caller sent there, e.g. `$.samples[0].input_ids[1] = -4 must be an
integer token id between 0 and 151935`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi
import orjson

from gateway.api import rules as body_rules
from gateway.errors import ApiError
from shared.decode_errors import MISSING, locate

T = TypeVar("T")


class BodyDecoder(Generic[T]):
    """JSON bytes -> one request of one deployment (its Struct, then `build`'s spec), or an ApiError."""

    def __init__(self, bounded: type, lenient: type, build: Callable[[Any], T]) -> None:
        """`bounded`: the type with the compiled bounds; `lenient`: the same type without them;
        `build`: what the handler needs, from a body that met its type and its rules."""
        self._bounded, self._lenient, self._build = bounded, lenient, build
        self._decoder = msgspec.json.Decoder(bounded)
        self._lenient_decoder = msgspec.json.Decoder(lenient)

    def decode(self, raw: bytes) -> T:
        try:
            body = self._decoder.decode(raw)
        except msgspec.ValidationError as error:
            raise self._refusal(raw, str(error)) from None
        except msgspec.DecodeError as error:
            raise not_json(raw, error) from None
        except RecursionError:
            raise too_deep() from None
        refuse_repeated_fields(raw)
        body_rules.check(body)
        return self._build(body)

    def _refusal(self, raw: bytes, bounded_error: str) -> ApiError:
        """400 when the body is malformed (a field named twice, its fields, the rules across them), else 413.
        A repeated field comes first: msgspec checks every copy but the message quotes the last."""
        try:
            refuse_repeated_fields(raw)
        except ApiError as error:
            return error
        try:
            body = self._lenient_decoder.decode(raw)
        except msgspec.ValidationError as error:
            return ApiError("invalid_request", invalid_message(self._lenient, str(error), raw))
        except msgspec.DecodeError as error:
            return not_json(raw, error)
        except RecursionError:
            return too_deep()
        try:
            body_rules.check(body)
        except ApiError as error:
            return error
        return ApiError("too_large", too_large_message(self._bounded, bounded_error, raw))


NUMBER_ARRAY = re.compile(rb"\[[0-9eE.+\-,\s]*\]")


def refuse_repeated_fields(raw: bytes) -> None:
    """400 when an object of the body (valid JSON) names a field twice: msgspec, like most JSON readers,
    keeps the last and drops the others without a word, so `{"samples": [...], "samples": [...]}` would
    lose samples. Python's JSON reader sees every pair; arrays of numbers (token ids), which hold no
    object, are emptied first, which makes the check about 0.2 ms for 120 KB of ids."""
    def pairs(items: list[tuple[str, Any]]) -> None:
        names = [name for name, _ in items]
        if len(set(names)) != len(names):
            repeated = next(name for name in names if names.count(name) > 1)
            raise ApiError("invalid_request", f"the body gives the field {repeated!r} {names.count(repeated)} times "
                                              "in one object; give each field once (JSON does not say which would "
                                              "count)")

    try:
        json.loads(NUMBER_ARRAY.sub(b"[]", raw), object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # what msgspec read but Python's reader does not: msgspec's answer stands
        return


def not_json(raw: bytes, error: Exception) -> ApiError:
    """orjson names the position and the cause more precisely (e.g. a lone surrogate): ask it."""
    try:
        orjson.loads(raw)
        detail = str(error)
    except orjson.JSONDecodeError as exc:
        detail = str(exc)
    return ApiError("invalid_request", f"the body is not valid JSON: {detail}")


def too_deep() -> ApiError:
    return ApiError("invalid_request", "the body nests arrays or objects too deeply to be read; no request "
                                       "body of this API nests more than four levels")


def invalid_message(root: type, message: str, raw: bytes) -> str:
    """The 400 message for msgspec's `message` about `raw` decoded as type `root` (shared/decode_errors.py)."""
    return locate(message, root, _decoded(raw)).message()


def too_large_message(root: type, message: str, raw: bytes) -> str:
    """The 413 message: the compiled bound's own text (http_types), filled in with what was sent."""
    error = locate(message, root, _decoded(raw))
    if error.steps is None:
        return f"{message} (over this deployment's compiled bounds; nothing was truncated)"
    node, value, path = error.type, error.value, error.where()
    bound = node.le if isinstance(node, mi.IntType) else getattr(node, "max_length", None)
    if "too_large" not in error.extra or value is MISSING or bound is None:
        return f"{path}: {error.problem} (this deployment's compiled bound; nothing was truncated)"
    steps = error.steps
    text = error.extra["too_large"].format(
        count=len(value) if isinstance(value, (list, str)) else None, value=value, bound=bound,
        index=next((s for s in reversed(steps) if isinstance(s, int)), None),
        name=next((s for s in reversed(steps) if isinstance(s, str)), ""))
    return f"{text} (at {path}; nothing was truncated)"


def _decoded(raw: bytes) -> Any:
    """The body as plain JSON values, to quote what the caller sent."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return MISSING
