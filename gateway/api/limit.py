"""A deployment's limit on one field of a request body, declared on the field's static type.

The request Structs (gateway/api/types.py) are declared once, at import: their shape is the same in
every deployment. What a deployment changes is a field's limits, and those are declared beside the
type as `Limit`s (`limited(...)`, a msgspec Meta): msgspec decodes the body without them, then
gateway/api/limit_check.py checks them against the deployment's `Limits` in one walk. Two kinds:
- validity (`too_large` None): outside it a request is malformed (a token id past the vocabulary,
  deadline_ms over max_deadline_ms, a priority outside [min_priority, max_priority]): 400;
- compiled bounds (`too_large` set: the 413 message, filled in with what was sent): samples per
  request, tokens per sample, labels, top_k, beam width, steps: 413 too_large.
The same declarations fill the deployment's values into /openapi.json (`fill_schema`: `maximum`,
`maxItems`, ..., with `x-compiled-bound` naming a compiled one) and into the type that a 400's
words describe (`fill_type`), so a message says "between 0 and 151935" as it did when the limits
were baked into the types.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Any

import msgspec.inspect as mi
from msgspec import Meta
from msgspec.structs import replace

from gateway.limits import Limits
from shared.bounds import Bounds
from shared.decode_errors import type_info

KEY = "limits"
"""Where a field's Limits sit in its Meta's `extra` (and, as markers, in its JSON Schema: `x-limits`)."""
SCHEMA_KEY = "x-limits"
KEYWORDS = ("le", "ge", "max_length", "one_of", "present")


@dataclass(frozen=True)
class Limit:
    """One limit of the deployment on a field: `keyword` against the Limits value named `name`.

    le / ge: the value is at most / at least `limits.limit(name) + offset`; max_length: the list or
    string is at most that long; one_of: the value is the deployment's `name` (a constraint set),
    present: the field is taken only when the deployment has a `name` at all. Where the deployment has
    none (one_of, present), only null is taken, and `hint` says why."""

    name: str
    keyword: str
    offset: int = 0
    too_large: str | None = None
    """A compiled bound's 413 message ({count}, {value}, {bound}, {index}, {name} filled in); None: 400."""
    hint: str | None = None
    _value: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.keyword not in KEYWORDS:
            raise ValueError(f"Limit keyword {self.keyword!r} is not one of {KEYWORDS}")
        path = f"bounds.{self.name}" if self.name in Bounds.__dataclass_fields__ else self.name
        object.__setattr__(self, "_value", operator.attrgetter(path))  # Limits.limit(name), without its lookup

    @property
    def compiled(self) -> bool:
        return self.too_large is not None

    def bound(self, limits: Limits) -> Any:
        """The deployment's value (a number, or for one_of / present the name's value: None when unset)."""
        if self.keyword in ("one_of", "present"):
            return self._value(limits)
        return self._value(limits) + self.offset

    def holds(self, value: Any, bound: Any) -> bool:
        """Whether `value` (not null) meets the limit at the deployment's `bound`."""
        if self.keyword == "le":
            return value <= bound
        if self.keyword == "ge":
            return value >= bound
        if self.keyword == "max_length":
            return len(value) <= bound
        if self.keyword == "one_of":
            return bound is not None and value == bound
        return bound is not None

    def marker(self) -> dict[str, Any]:
        """The limit in the field's JSON Schema, until fill_schema writes the deployment's value there."""
        return {"name": self.name, "keyword": self.keyword, "offset": self.offset, "hint": self.hint}


def limited(*limits: Limit, **meta: Any) -> Meta:
    """A msgspec Meta declaring `limits` on the type it annotates (with any other Meta arguments)."""
    extra = {**meta.pop("extra", {}), KEY: limits}
    schema = {SCHEMA_KEY: [limit.marker() for limit in limits]}
    compiled = [limit.name for limit in limits if limit.compiled]
    if compiled:
        schema["x-compiled-bound"] = compiled[0]
    return Meta(**meta, extra=extra, extra_json_schema=schema)


def declared(extra: dict[str, Any] | None) -> tuple[Limit, ...]:
    return (extra or {}).get(KEY, ())


def null_only(hint: str | None) -> mi.Metadata:
    """The type of a field the deployment takes only as null (absent), saying why."""
    return mi.Metadata(mi.NoneType(), extra={"hint": hint} if hint else {})


def applied(limit: Limit, node: mi.Metadata, limits: Limits) -> mi.Metadata:
    """The annotated `node` with `limit` at this deployment's value written into its type."""
    bound = limit.bound(limits)
    if limit.keyword in ("one_of", "present"):
        if bound is None:
            return null_only(limit.hint)
        return replace(node, type=mi.LiteralType((bound,))) if limit.keyword == "one_of" else node
    return replace(node, type=replace(node.type, **{limit.keyword: bound}))


@functools.lru_cache(maxsize=64)
def fill_type(root: type, limits: Limits) -> Any:
    """msgspec.inspect's type of `root` with the deployment's validity limits written in (not its compiled
    bounds): what a 400 message describes (shared/decode_errors.locate takes it in place of a type)."""
    return _filled(type_info(root), limits)


def _filled(info: Any, limits: Limits) -> Any:
    if isinstance(info, mi.Metadata):
        node = replace(info, type=_filled(info.type, limits))
        for limit in declared(info.extra):
            if not limit.compiled:
                node = applied(limit, node, limits)
        return node
    if isinstance(info, mi.UnionType):
        members = tuple(_filled(m, limits) for m in info.types)
        nulls = [m for m in members if isinstance(m, mi.Metadata) and isinstance(m.type, mi.NoneType)]
        return nulls[0] if nulls else replace(info, types=members)  # null or null: one null, with its hint
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return replace(info, item_type=_filled(info.item_type, limits))
    if isinstance(info, mi.DictType):
        return replace(info, value_type=_filled(info.value_type, limits))
    if isinstance(info, mi.StructType):
        return replace(info, fields=tuple(replace(f, type=_filled(f.type, limits)) for f in info.fields))
    return info


JSON_KEYWORDS = {"le": "maximum", "ge": "minimum"}


def fill_schema(schema: Any, limits: Limits) -> Any:
    """The JSON Schema (msgspec's, of the static types) with each `x-limits` marker replaced by the
    deployment's value: `maximum`, `minimum`, `maxItems` / `maxLength`, an enum, or null only."""
    if isinstance(schema, list):
        return [fill_schema(item, limits) for item in schema]
    if not isinstance(schema, dict):
        return schema
    filled = {key: fill_schema(value, limits) for key, value in schema.items() if key != SCHEMA_KEY}
    for marker in schema.get(SCHEMA_KEY, ()):
        limit = Limit(**marker)
        bound = limit.bound(limits)
        if limit.keyword in ("one_of", "present"):
            if bound is None:
                return {"type": "null"}
            if limit.keyword == "one_of":
                filled = {k: v for k, v in filled.items() if k != "type"} | {"enum": [bound]}
        elif limit.keyword == "max_length":
            filled["maxItems" if filled.get("type") == "array" else "maxLength"] = bound
        else:
            filled[JSON_KEYWORDS[limit.keyword]] = bound
    if "anyOf" in filled:  # a member made null only may repeat the union's own null
        members = []
        for member in filled["anyOf"]:
            if member not in members:
                members.append(member)
        filled["anyOf"] = members
        if len(members) == 1:
            filled = {k: v for k, v in filled.items() if k != "anyOf"} | members[0]
    return filled
