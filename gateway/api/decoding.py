"""Decoding a JSON request body into its declared type (gateway/api/types.py), and the answer when
it does not fit: 400 invalid_request or 413 too_large, naming the field path and the fix.

msgspec validates the body's shape while it parses, at C speed, and stops at the first problem with
its path (`$.samples[3].input_ids[0]`); the deployment's limits on its fields (gateway/api/limit.py)
are checked next, in one walk (gateway/api/limit_check.py). Order of answers: a malformed field
(400: a shape msgspec refused, or a validity limit), then a rule across fields (400), then a
compiled bound exceeded (413). The message is written from the type at that path, with the
deployment's limits filled in, and the value the caller sent there, e.g.
`$.samples[0].input_ids[1] = -4 must be an integer token id between 0 and 151935`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import orjson

from gateway.api.limit import fill_type
from gateway.api.limit_check import LimitCheck
from gateway.api.repeated_fields import RepeatedFields, refuse_repeated_fields
from gateway.api.rule_check import RuleCheck
from gateway.errors import ApiError
from gateway.limits import Limits
from shared.decode_errors import MISSING, locate

T = TypeVar("T")


class BodyDecoder(Generic[T]):
    """JSON bytes -> one request (its Struct, then `build`'s spec) at a deployment's limits, or an ApiError.
    One per request type, made at import: nothing in it depends on the deployment."""

    def __init__(self, root: type, build: Callable[[Any, Limits], T]) -> None:
        """`root`: the request Struct; `build`: what the handler needs, from a body that met its type, its
        limits and its rules."""
        self._root, self._build = root, build
        self._decoder = msgspec.json.Decoder(root)
        self._limits = LimitCheck(root)
        self._rules = RuleCheck(root)
        self._repeated = RepeatedFields(root)

    def decode(self, raw: bytes, limits: Limits) -> T:
        try:
            body = self._decoder.decode(raw)
        except msgspec.ValidationError as error:  # a field named twice comes first: msgspec quotes the last
            refuse_repeated_fields(raw)
            raise ApiError("invalid_request", invalid_message(fill_type(self._root, limits), str(error), raw)) from None
        except msgspec.DecodeError as error:
            raise not_json(raw, error) from None
        except RecursionError:
            raise too_deep() from None
        self._repeated.refuse(raw)
        over = None
        for broken in self._limits.broken(body, limits):
            if not broken.limit.compiled:
                raise ApiError("invalid_request", broken.message(limits))
            over = over or broken
        self._rules.check(body, limits)
        if over is not None:
            raise ApiError("too_large", over.message(limits))
        return self._build(body, limits)


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


def invalid_message(root: Any, message: str, raw: bytes) -> str:
    """The 400 message for msgspec's `message` about `raw` decoded as `root` (a type, or msgspec.inspect's
    type with the deployment's limits filled in; shared/decode_errors.py)."""
    return locate(message, root, _decoded(raw)).message()


def _decoded(raw: bytes) -> Any:
    """The body as plain JSON values, to quote what the caller sent."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return MISSING
