"""Decoding a JSON request body into its declared type (gateway/http_types.py), and the answer when
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

import functools
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi
import orjson

from gateway.errors import ApiError

_AT = re.compile(r"(?P<what>.*?)(?: - at `(?P<path>\$[^`]*)`)?", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]")
_FIELD = re.compile(r"Object (?P<kind>contains unknown|missing required) field `(?P<name>[^`]*)`")
_MISSING: Any = object()  # the value at a path could not be read back from the body
T = TypeVar("T")


class BodyDecoder(Generic[T]):
    """JSON bytes -> one request of one deployment (its Struct, then `build`'s spec), or an ApiError."""

    def __init__(self, bounded: type, lenient: type, build: Callable[[Any], T]) -> None:
        """`bounded`: the type with the compiled bounds; `lenient`: the same type without them;
        `build`: the checks across fields (raising ApiError) and what the handler needs."""
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
        return self._build(body)

    def _refusal(self, raw: bytes, bounded_error: str) -> ApiError:
        """400 when the body is malformed (its fields, or the rules across them), else 413."""
        try:
            body = self._lenient_decoder.decode(raw)
        except msgspec.ValidationError as error:
            return ApiError("invalid_request", invalid_message(_info(self._lenient), str(error), raw))
        except msgspec.DecodeError as error:
            return not_json(raw, error)
        except RecursionError:
            return too_deep()
        try:
            self._build(body)
        except ApiError as error:
            return error
        return ApiError("too_large", too_large_message(_info(self._bounded), bounded_error, raw))


@functools.lru_cache(maxsize=64)
def _info(cls: type) -> Any:
    return mi.type_info(cls)


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
    """The 400 message for msgspec's `message` about `raw` decoded as type `root`."""
    what, path, steps = _split(message)
    if steps is None:
        return message
    node, extra, value = _node(root, steps, _decoded(raw))
    field = _FIELD.fullmatch(what)
    if field and isinstance(node, mi.StructType):
        name = field["name"]
        if field["kind"] == "contains unknown":
            known = ", ".join(f.encode_name for f in node.fields)
            return f"unknown field {name!r} in {_where(path)}; known fields: {known}"
        wanted = next((f.type for f in node.fields if f.encode_name == name), None)
        return f"missing required field {path}.{name}" + (f" ({describe(wanted)})" if wanted else "")
    shown = "" if value is _MISSING else f" = {_show(value)}"
    hint = f"; {extra['hint']}" if "hint" in extra else ""
    return f"{_where(path)}{shown} must be {describe(node, extra=extra)}{hint}"


def too_large_message(root: Any, message: str, raw: bytes) -> str:
    """The 413 message: the compiled bound's own text (http_types), filled in with what was sent."""
    what, path, steps = _split(message)
    if steps is None:
        return f"{message} (over this deployment's compiled bounds; nothing was truncated)"
    node, extra, value = _node(root, steps, _decoded(raw))
    bound = node.le if isinstance(node, mi.IntType) else getattr(node, "max_length", None)
    if "too_large" not in extra or value is _MISSING or bound is None:
        return f"{path}: {what} (this deployment's compiled bound; nothing was truncated)"
    text = extra["too_large"].format(
        count=len(value) if isinstance(value, (list, str)) else None, value=value, bound=bound,
        index=next((s for s in reversed(steps) if isinstance(s, int)), None),
        name=next((s for s in reversed(steps) if isinstance(s, str)), ""))
    return f"{text} (at {path}; nothing was truncated)"


def _split(message: str) -> tuple[str, str, list[str | int] | None]:
    """msgspec's message -> (what, path, path steps); steps None when the path does not parse."""
    match = _AT.fullmatch(message)
    what, path = match["what"], match["path"] or "$"
    steps = [name or int(index) for name, index in _STEP.findall(path, 1)]
    rebuilt = "$" + "".join(f".{s}" if isinstance(s, str) else f"[{s}]" for s in steps)
    return what, path, steps if rebuilt == path else None


def _decoded(raw: bytes) -> Any:
    """The body as plain JSON values, to quote what the caller sent."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return _MISSING


def _child(value: Any, step: str | int) -> Any:
    try:
        return value[step]
    except (LookupError, TypeError):
        return _MISSING


def _node(info: Any, steps: list[str | int], value: Any) -> tuple[Any, dict[str, Any], Any]:
    """The type at the path (the union member its value takes), its `extra`, and that value."""
    info, extra = _unwrap(info, value)
    for step in steps:
        if isinstance(info, mi.StructType):
            field = next((f for f in info.fields if f.encode_name == step), None)
            if field is None:
                break
            info = field.type
        elif isinstance(info, mi.ListType):
            info = info.item_type
        else:
            break
        value = _child(value, step)
        info, extra = _unwrap(info, value)
    return info, extra, value


def _unwrap(info: Any, value: Any) -> tuple[Any, dict[str, Any]]:
    """Through Annotated metadata (collecting `extra`) and into the union member `value` fits."""
    extra: dict[str, Any] = {}
    while True:
        if isinstance(info, mi.Metadata):
            extra.update(info.extra or {})
            info = info.type
        elif isinstance(info, mi.UnionType):
            members = [m for m in info.types if _fits(m, value)]
            if len(members) != 1:
                return info, extra
            info = members[0]
        else:
            return info, extra


def _fits(info: Any, value: Any) -> bool:
    """Whether `value` is of the JSON kind `info` takes (not whether it meets its limits)."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if value is _MISSING:
        return False
    if isinstance(info, mi.LiteralType):
        return any(type(v) is type(value) for v in info.values)
    kinds = {mi.NoneType: type(None), mi.BoolType: bool, mi.IntType: int, mi.FloatType: float,
             mi.StrType: str, mi.ListType: list, mi.StructType: dict}
    return type(value) is kinds.get(type(info)) or (isinstance(info, mi.FloatType) and type(value) is int)


def describe(info: Any, plural: bool = False, extra: dict[str, Any] | None = None) -> str:
    """What a type takes, in words: `a non-empty list of integer token ids between 0 and 1023`."""
    extra = dict(extra or {})
    while isinstance(info, mi.Metadata):
        extra.update(info.extra or {})
        info = info.type
    if isinstance(info, mi.UnionType):  # null stands for absent: not worth saying
        return " or ".join(describe(m, plural) for m in info.types if not isinstance(m, mi.NoneType)) or "null"
    if isinstance(info, mi.IntType):
        noun = " ".join(["integer", *filter(None, [extra.get("noun")])])
        lo = info.ge if info.gt is None else info.gt + 1
        hi = info.le if info.lt is None else info.lt - 1
        return (f"{noun}s" if plural else f"an {noun}") + _span(lo, hi, "")
    if isinstance(info, mi.StrType):
        return ("strings" if plural else "a string") + _span(info.min_length, info.max_length, " characters")
    if isinstance(info, mi.ListType):
        head = ("non-empty lists" if plural else "a non-empty list") if info.min_length == 1 else (
            "lists" if plural else "a list")
        most = f" (at most {info.max_length})" if info.max_length is not None else ""
        return f"{head} of {describe(info.item_type, plural=True)}{most}"
    if isinstance(info, mi.StructType):
        fields = ", ".join(f.encode_name for f in info.fields)
        return ("objects" if plural else "an object") + f" with fields {fields}"
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in info.values)
    return {mi.BoolType: "true or false", mi.NoneType: "null", mi.FloatType: "a number"}.get(
        type(info), type(info).__name__)


def _span(lo: int | None, hi: int | None, unit: str) -> str:
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}{unit}"
    if hi is not None:
        return f" of at most {hi}{unit}"
    return f" of at least {lo}{unit}" if lo is not None else ""


def _where(path: str) -> str:
    return "the request body ($)" if path == "$" else path


def _show(value: Any, limit: int = 40) -> str:
    """The value as the caller wrote it (JSON), shortened."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
