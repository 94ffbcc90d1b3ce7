"""msgspec's validation errors in words: the one translator for every place that decodes with msgspec
(HTTP request bodies in gateway/api/decoding.py, the wire messages in shared/protocol/codec.py, the
deployment config in shared/config.py).

msgspec validates while it decodes and stops at the first problem, saying what it expected and
where: "Expected `int` >= 0 - at `$.samples[3].input_ids[0]`" (an object's fields by name, an
array-like Struct's fields by position, `$[2][0][7]`, a dict's values as `[...]`). `locate` follows
that path through the declared type, naming positions by their fields, and finds the type declared
there (the union member the value sent takes), the `Meta.extra` collected on the way and the value
sent; `FieldError.message` says it in one sentence, in the words of the surface (`Style`):
`$.samples[0].input_ids[1] = -4 must be an integer token id between 0 and 151935`,
`bounds.max_beam_width = 401 must be an integer between 1 and 400`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import msgspec.inspect as mi

MISSING: Any = object()
"""The value at a path could not be read back from what was sent."""

_AT = re.compile(r"(?P<what>.*?)(?: - at `(?P<path>\$[^`]*)`)?", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+|\.\.\.)\]")
_FIELD = re.compile(r"Object (?P<kind>contains unknown|missing required) field `(?P<name>.*)`", re.DOTALL)
_DICT_KEY = "..."  # msgspec's step into a dict's value: it does not say which key


@dataclass(frozen=True)
class Style:
    """How a surface names its parts: the path's root, the whole document, a field, an object."""

    root: str = "$"
    """Written before the path: "$" for JSON bodies ($.samples[0]), "" for names (bounds.max_top_k)."""
    whole: str = "the request body ($)"
    """The document itself, where the problem is at its top."""
    field: str = "field"
    object: str = "an object"


JSON_BODY = Style()


@dataclass(frozen=True)
class FieldError:
    """One msgspec ValidationError, located in the declared type."""

    problem: str
    """msgspec's own words, without the path ("Expected `int` >= 0")."""
    steps: tuple[str | int, ...] | None
    """The path, fields by name and list items by index; None when msgspec's path did not parse."""
    type: Any
    """msgspec.inspect's type declared at the path (the union member the value sent takes, if one)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The `Meta(extra=...)` declared on the type at the path (a 413 text, a noun, a hint)."""
    value: Any = MISSING
    """What was sent at the path, as plain values."""

    def where(self, style: Style = JSON_BODY) -> str:
        """The path in the surface's words: `$.samples[3]`, `requests[0].prefix_len`, `bounds.max_top_k`."""
        text = style.root + "".join(f".{s}" if isinstance(s, str) and s != _DICT_KEY else f"[{s}]"
                                    for s in self.steps or ())
        return text.removeprefix(".") if style.root == "" else text

    def message(self, style: Style = JSON_BODY) -> str:
        """The whole problem in one sentence: the place, the value sent and what it must be."""
        if self.steps is None:
            return self.problem
        place = self.where(style) if self.steps else style.whole
        named = _FIELD.fullmatch(self.problem)
        if named and isinstance(self.type, (mi.StructType, mi.DataclassType)):
            name = named["name"]
            if named["kind"] == "contains unknown":
                known = ", ".join(_field_name(f) for f in self.type.fields)
                shown = name if len(name) <= 80 else name[:77] + "..."  # a name can be as long as the body
                return f"unknown {style.field} {shown!r} in {place}; known {style.field}s: {known}"
            wanted = next((f.type for f in self.type.fields if _field_name(f) == name), None)
            inside = self.where(style)
            return (f"missing required {style.field} {inside + '.' if inside else ''}{name}"
                    + (f" ({describe(wanted, style=style)})" if wanted is not None else ""))
        shown = "" if self.value is MISSING else f" = {show(self.value)}"
        if self.type is None:  # a path the declared type does not have (a union no value decided)
            return f"{place}{shown}: {self.problem}"
        hint = f"; {self.extra['hint']}" if "hint" in self.extra else ""
        return f"{place}{shown} must be {describe(self.type, extra=self.extra, style=style)}{hint}"


def locate(error: msgspec.ValidationError | str, root: Any, sent: Any = MISSING) -> FieldError:
    """msgspec's error about `sent` (the value decoded as plain data) decoded as type `root` (or as the
    msgspec.inspect type `root`)."""
    top = root if isinstance(root, mi.Type) else type_info(root)  # a type, or msgspec.inspect's of one
    match = _AT.fullmatch(str(error))
    problem, path = match["what"], match["path"] or "$"
    raw_steps = [name or (index if index == _DICT_KEY else int(index)) for name, index in _STEP.findall(path, 1)]
    rebuilt = "$" + "".join(f".{s}" if isinstance(s, str) and s != _DICT_KEY else f"[{s}]" for s in raw_steps)
    if rebuilt != path:
        return FieldError(problem, None, top)
    value = sent
    info, extra = _unwrap(top, value)
    named: list[str | int] = []
    for step in raw_steps:
        info, name = _step(info, step)
        named.append(name)
        if info is None:
            return FieldError(problem, tuple(named), None, extra, MISSING)
        value = _child(value, step)
        info, extra = _unwrap(info, value)
    return FieldError(problem, tuple(named), info, extra, value)


@functools.lru_cache(maxsize=128)
def type_info(cls: Any) -> Any:
    return mi.type_info(cls)


def _field_name(f: Any) -> str:
    return getattr(f, "encode_name", f.name)


def _step(info: Any, step: str | int) -> tuple[Any, str | int]:
    """The type one path step below `info`, and the step's name (an array-like field by its name)."""
    if isinstance(info, mi.UnionType):
        info = _member_for_step(info, step)
    if isinstance(info, (mi.StructType, mi.DataclassType)):
        if isinstance(step, int):
            if step >= len(info.fields):
                return None, step
            found = info.fields[step]
        else:
            found = next((f for f in info.fields if _field_name(f) == step), None)
            if found is None:
                return None, step
        return found.type, _field_name(found)
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return info.item_type, step
    if isinstance(info, mi.TupleType) and isinstance(step, int) and step < len(info.item_types):
        return info.item_types[step], step
    if isinstance(info, mi.DictType):
        return info.value_type, step
    return None, step


def _member_for_step(union: Any, step: str | int) -> Any:
    """Where the value sent could not tell union members apart: the one a step can go into."""
    def takes(member: Any) -> bool:
        member = _plain(member)
        if isinstance(member, (mi.StructType, mi.DataclassType)):
            return isinstance(step, int) or any(_field_name(f) == step for f in member.fields)
        return isinstance(member, (mi.ListType, mi.VarTupleType, mi.TupleType, mi.DictType))
    members = [m for m in union.types if takes(m)]
    return _plain(members[0]) if len(members) == 1 else union


def _plain(info: Any) -> Any:
    while isinstance(info, mi.Metadata):
        info = info.type
    return info


def _child(value: Any, step: str | int) -> Any:
    if step == _DICT_KEY:
        return MISSING
    try:
        return value[step]
    except (LookupError, TypeError):
        return MISSING


def _unwrap(info: Any, value: Any) -> tuple[Any, dict[str, Any]]:
    """Through Annotated metadata (collecting `extra`) and into the union member `value` fits."""
    extra: dict[str, Any] = {}
    while True:
        if isinstance(info, mi.Metadata):
            extra.update(info.extra or {})
            info = info.type
        elif isinstance(info, mi.UnionType):
            members = [m for m in info.types if fits(m, value)]
            if len(members) != 1:
                return info, extra
            info = members[0]
        else:
            return info, extra


_KINDS = {mi.NoneType: (type(None),), mi.BoolType: (bool,), mi.IntType: (int,), mi.FloatType: (float, int),
          mi.StrType: (str,), mi.BytesType: (bytes,), mi.ByteArrayType: (bytes,), mi.ListType: (list,),
          mi.VarTupleType: (list,), mi.TupleType: (list,), mi.SetType: (list,), mi.FrozenSetType: (list,),
          mi.DictType: (dict,), mi.DataclassType: (dict,)}


def fits(info: Any, value: Any) -> bool:
    """Whether `value` (plain data) is of the kind `info` takes, whatever its limits."""
    info = _plain(info)
    if value is MISSING:
        return False
    if isinstance(info, mi.LiteralType):
        return any(type(v) is type(value) for v in info.values)
    if isinstance(info, mi.EnumType):
        return any(type(m.value) is type(value) for m in info.cls)
    if isinstance(info, mi.StructType):
        return type(value) is (list if info.array_like else dict)
    return type(value) in _KINDS.get(type(info), ())


def describe(info: Any, plural: bool = False, extra: dict[str, Any] | None = None, style: Style = JSON_BODY) -> str:
    """What a type takes, in words: `a non-empty list of integer token ids between 0 and 1023`."""
    extra = dict(extra or {})
    while isinstance(info, mi.Metadata):
        extra.update(info.extra or {})
        info = info.type
    if isinstance(info, mi.UnionType):  # null stands for absent: not worth saying
        words = [describe(m, plural, style=style) for m in info.types if not isinstance(m, mi.NoneType)]
        return " or ".join(words) or "null"
    if isinstance(info, (mi.IntType, mi.FloatType)):
        noun = " ".join(["integer" if isinstance(info, mi.IntType) else "number", *filter(None, [extra.get("noun")])])
        article = "an" if noun[0] in "aeiou" else "a"
        return (f"{noun}s" if plural else f"{article} {noun}") + _number_span(info)
    if isinstance(info, mi.StrType):
        return ("strings" if plural else "a string") + _span(info.min_length, info.max_length, " characters")
    if isinstance(info, (mi.BytesType, mi.ByteArrayType)):
        return ("byte strings" if plural else "a byte string") + _span(info.min_length, info.max_length, " bytes")
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        head = ("non-empty lists" if plural else "a non-empty list") if info.min_length == 1 else (
            "lists" if plural else "a list")
        most = f" (at most {info.max_length})" if info.max_length is not None else ""
        return f"{head} of {describe(info.item_type, plural=True, style=style)}{most}"
    if isinstance(info, mi.TupleType):
        return f"a list of {len(info.item_types)}: " + ", ".join(describe(t, style=style) for t in info.item_types)
    if isinstance(info, mi.DictType):
        return f"{'maps' if plural else 'a map'} of {describe(info.value_type, plural=True, style=style)}"
    if isinstance(info, (mi.StructType, mi.DataclassType)):
        fields = ", ".join(_field_name(f) for f in info.fields)
        if getattr(info, "array_like", False):
            required = sum(f.required for f in info.fields)
            first = "" if required == len(info.fields) else (
                f" (the first {required} required)" if required else " (each optional)")
            return ("arrays" if plural else "an array") + f" of its {len(info.fields)} fields {fields}{first}"
        noun = style.object.split(" ", 1)[1]
        return (f"{noun}s" if plural else style.object) + f" with {style.field}s {fields}"
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in info.values)
    if isinstance(info, mi.EnumType):
        return "one of " + ", ".join(str(m.value) for m in info.cls)
    return {mi.BoolType: "true or false", mi.NoneType: "null"}.get(type(info), type(info).__name__)


def _span(lo: int | None, hi: int | None, unit: str) -> str:
    def count(n: int) -> str:
        return f"{n}{unit.removesuffix('s') if n == 1 else unit}"
    if lo is not None and hi is not None:
        return f" between {lo} and {count(hi)}"
    if hi is not None:
        return f" of at most {count(hi)}"
    return f" of at least {count(lo)}" if lo is not None else ""


def _number_span(info: Any) -> str:
    """An integer's or a number's range; an integer's strict bounds as inclusive ones (> 0: >= 1)."""
    lo, hi, above, below = info.ge, info.le, info.gt, info.lt
    if isinstance(info, mi.IntType):
        lo = lo if above is None else above + 1
        hi = hi if below is None else below - 1
        above = below = None
    words = [f"above {above}" if above is not None else "", f"below {below}" if below is not None else ""]
    if above is None and below is None:
        return _span(lo, hi, "")
    words += [f"at least {lo}" if lo is not None else "", f"at most {hi}" if hi is not None else ""]
    return " " + " and ".join(filter(None, words))


def show(value: Any, limit: int = 40) -> str:
    """The value as it was sent (JSON's spelling, which TOML shares for these values), shortened."""
    if isinstance(value, (bytes, bytearray)) or isinstance(value, float) and not math.isfinite(value):
        text = repr(value)
    else:
        try:
            text = msgspec.json.encode(value).decode()
        except (TypeError, OverflowError, msgspec.EncodeError):  # a msgpack extension, say
            text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
