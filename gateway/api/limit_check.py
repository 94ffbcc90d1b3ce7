"""A decoded request body checked against its deployment's limits (gateway/api/limit.py), in one walk.

`LimitCheck(root)` is built once per request Struct, at import: from the static type it keeps only
the paths that hold a `Limit` (a body of texts walks a few fields, not every character). `broken`
walks a decoded body in field order and yields each limit it breaks, as a `Broken`: the decoder
answers the first validity one with 400, else (after the rules across fields) the first compiled
bound with 413 — the order msgspec's own checks gave when the limits were part of the types.
A list of token ids is checked by its min and max (C speed), its items only when one is out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi

from gateway.api.limit import SCHEMA_KEY, Limit, applied, declared
from gateway.limits import Limits
from shared.decode_errors import FieldError, type_info

Steps = tuple[str | int, ...]


@dataclass(frozen=True)
class Broken:
    """One limit a body breaks: where, what was sent there, the deployment's value, the declared node."""

    limit: Limit
    steps: Steps
    value: Any
    bound: Any
    node: mi.Metadata
    """The annotated type the limit is declared on (the words of a 400 describe it, filled in)."""

    def message(self, limits: Limits) -> str:
        """400: the field, the value and what it must be; 413: the bound's own words, filled in."""
        if not self.limit.compiled:
            node: Any = self.node
            for limit in declared(self.node.extra):  # every validity limit: "between -10 and 10", both ends
                if not limit.compiled:
                    node = applied(limit, node, limits)
            extra: dict[str, Any] = {}
            while isinstance(node, mi.Metadata):
                extra.update(node.extra or {})
                node = node.type
            return FieldError("", self.steps, node, extra, self.value).message()
        steps, value = self.steps, self.value
        text = self.limit.too_large.format(
            count=len(value) if isinstance(value, (list, str)) else None, value=value, bound=self.bound,
            index=next((s for s in reversed(steps) if isinstance(s, int)), None),
            name=next((s for s in reversed(steps) if isinstance(s, str)), ""))
        return f"{text} (at {FieldError('', steps, None).where()}; nothing was truncated)"


class _Node:
    """The limits declared at one place of a type, and the walk of the places below it that hold any:
    `ok` answers fast whether all hold (the usual case, no paths built); `broken` says which do not."""

    def __init__(self, node: mi.Metadata | None, below: _Walk | None) -> None:
        self.node, self.limits, self.below = node, declared(node.extra) if node else (), below

    def ok(self, value: Any, limits: Limits) -> bool:
        for limit in self.limits:
            if not limit.holds(value, limit.bound(limits)):
                return False
        return self.below is None or self.below.ok(value, limits)

    def broken(self, value: Any, steps: Steps, limits: Limits) -> Iterator[Broken]:
        for limit in self.limits:
            bound = limit.bound(limits)
            if not limit.holds(value, bound):
                yield Broken(limit, steps, value, bound, self.node)
        if self.below is not None:
            yield from self.below.broken(value, steps, limits)


class LimitCheck:
    """The limits of one request Struct, checked on its decoded bodies."""

    def __init__(self, root: type) -> None:
        self._walk = _plan(type_info(root))

    def broken(self, body: Any, limits: Limits) -> Iterator[Broken]:
        """Every limit `body` breaks at this deployment, in field order."""
        if self._walk is not None and not self._walk.ok(body, limits):
            yield from self._walk.broken(body, (), limits)


def _plan(info: Any) -> _Node | None:
    """The walk for values of type `info`; None where nothing below holds a limit."""
    metadata = None
    while isinstance(info, mi.Metadata):
        markers = (info.extra_json_schema or {}).get(SCHEMA_KEY, ())
        if len(markers) != len(declared(info.extra)):  # msgspec merges the Metas of one type: one `extra` won
            raise TypeError("declare a field's limits in one Meta (gateway/api/limit.py's limited): "
                            f"{len(markers)} were declared, {len(declared(info.extra))} kept")
        if declared(info.extra):
            metadata = info
        info = info.type
    below = _below(info)
    return None if metadata is None and below is None else _Node(metadata, below)


def _below(info: Any) -> _Walk | None:
    if isinstance(info, mi.StructType):
        fields = [(f.name, walk) for f in info.fields if (walk := _plan(f.type)) is not None]
        return _Fields(fields) if fields else None
    if isinstance(info, (mi.ListType, mi.VarTupleType)):
        item = _plan(info.item_type)
        if item is None:
            return None
        return _Numbers(item) if _is_number_leaf(item) else _Items(item)
    if isinstance(info, mi.UnionType):
        members = {kind: walk for m in info.types if (walk := _plan(m)) is not None for kind in _kinds(m)}
        return _Union(members) if members else None
    return None


def _kinds(info: Any) -> tuple[type, ...]:
    """The Python types a value of `info` decodes to (a union's member is picked by them)."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.StructType):
        return (info.cls,)
    if isinstance(info, mi.LiteralType):
        return tuple({type(v) for v in info.values})
    return {mi.IntType: (int,), mi.FloatType: (float, int), mi.StrType: (str,), mi.ListType: (list,),
            mi.VarTupleType: (tuple,), mi.DictType: (dict,), mi.BoolType: (bool,)}.get(type(info), ())


class _Walk:
    """How to go below one place: into a Struct's fields, a list's items, a union's member."""

    def ok(self, value: Any, limits: Limits) -> bool:
        raise NotImplementedError

    def broken(self, value: Any, steps: Steps, limits: Limits) -> Iterator[Broken]:
        raise NotImplementedError


class _Fields(_Walk):
    def __init__(self, fields: list[tuple[str, _Node]]) -> None:
        self.fields = fields

    def ok(self, body: Any, limits: Limits) -> bool:
        for name, node in self.fields:
            value = getattr(body, name)
            if value is not None and not node.ok(value, limits):
                return False
        return True

    def broken(self, body: Any, steps: Steps, limits: Limits) -> Iterator[Broken]:
        for name, node in self.fields:
            value = getattr(body, name)
            if value is not None:
                yield from node.broken(value, (*steps, name), limits)


class _Items(_Walk):
    def __init__(self, item: _Node) -> None:
        self.item = item
        self.members = item.below.members if item.node is None and isinstance(item.below, _Union) else None
        """A list of a union (texts or sample objects): each item's member, looked up without a call."""

    def ok(self, values: list, limits: Limits) -> bool:
        if self.members is not None:
            get = self.members.get
            for value in values:
                node = get(type(value))
                if node is not None and not node.ok(value, limits):
                    return False
            return True
        return all(self.item.ok(value, limits) for value in values)

    def broken(self, values: list, steps: Steps, limits: Limits) -> Iterator[Broken]:
        for index, value in enumerate(values):
            yield from self.item.broken(value, (*steps, index), limits)


def _is_number_leaf(node: _Node) -> bool:
    return node.below is None and all(limit.keyword in ("le", "ge") for limit in node.limits)


class _Numbers(_Items):
    """A list of numbers (token ids): its min and max against the limits (C speed), each item only past one."""

    def ok(self, values: list, limits: Limits) -> bool:
        if not values:
            return True
        for limit in self.item.limits:
            if not limit.holds(max(values) if limit.keyword == "le" else min(values), limit.bound(limits)):
                return False
        return True


class _Union(_Walk):
    def __init__(self, members: dict[type, _Node]) -> None:
        self.members = members

    def ok(self, value: Any, limits: Limits) -> bool:
        node = self.members.get(type(value))
        return node is None or node.ok(value, limits)

    def broken(self, value: Any, steps: Steps, limits: Limits) -> Iterator[Broken]:
        node = self.members.get(type(value))
        if node is not None:
            yield from node.broken(value, steps, limits)
