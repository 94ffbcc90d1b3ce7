"""A decoded request body checked against the rules across its fields (gateway/api/rules.py), inner Structs first.

`RuleCheck(root)` is built once per request Struct, at import: from the static type it keeps, per Struct
class, its `RULES` and the fields that may hold a Struct with rules (a sample object, or a list of them),
so a check never looks at a list that cannot hold one: a list of token ids or of texts is not walked
(walking every item of 15 x 500 token ids cost 0.7 ms a body, more than msgspec's parse of it).
Order: each field in declaration order (a Struct in it, or each Struct item of a list, checked first,
at its path `$.samples[3]`), then the Struct's own rules; the first broken one is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi

from gateway.api.rules import Rule, at
from gateway.errors import ApiError
from gateway.limits import Limits
from shared.decode_errors import type_info


@dataclass(frozen=True)
class _Plan:
    """One Struct class: its rules, and its fields (name, whether a list of them) that may hold a Struct
    with rules below."""

    rules: tuple[Rule, ...]
    inner: tuple[tuple[str, bool], ...]


class RuleCheck:
    """The rules of one request Struct and of the Structs it may hold, checked on its decoded bodies."""

    def __init__(self, root: type) -> None:
        self._plans = _plans_of(type_info(root))

    def check(self, body: Any, limits: Limits) -> None:
        """ApiError 400 at the first rule `body` breaks at the deployment `limits` (inner Structs first)."""
        self._check(body, limits, "$")

    def _check(self, body: Any, limits: Limits, where: str) -> None:
        plan, plans = self._plans[type(body)], self._plans
        for name, listed in plan.inner:
            value = getattr(body, name)
            if not listed:
                if type(value) in plans:
                    self._check(value, limits, f"{where}.{name}")
            elif type(value) is list:
                for index, item in enumerate(value):
                    if type(item) in plans:
                        self._check(item, limits, f"{where}.{name}[{index}]")
        for rule in plan.rules:
            problem = at(rule, limits).broken(body, where)
            if problem is not None:
                raise ApiError("invalid_request", problem)


def _plans_of(root: mi.StructType) -> dict[type, _Plan]:
    """The plan of `root` and of every Struct below it. A field is walked when a Struct it may hold has
    rules, or holds (however deep, a type holding itself included) a Struct that has."""
    fields: dict[type, list[tuple[str, bool, list[type]]]] = {}
    rules: dict[type, tuple[Rule, ...]] = {}
    pending = [root]
    while pending:
        info = pending.pop()
        if info.cls in fields:
            continue
        rules[info.cls] = tuple(getattr(info.cls, "RULES", ()))
        fields[info.cls] = []
        for field in info.fields:
            for listed, structs in enumerate(_structs_in(field.type)):
                if structs:
                    fields[info.cls].append((field.name, bool(listed), [s.cls for s in structs]))
                    pending.extend(structs)
    ruled = {cls for cls in rules if rules[cls]}
    while True:  # the classes with rules at or below them, to a fixed point
        more = {cls for cls, held in fields.items() if any(c in ruled for _, _, classes in held for c in classes)}
        if more <= ruled:
            break
        ruled |= more
    return {cls: _Plan(rules[cls], tuple((name, listed) for name, listed, classes in held
                                         if any(c in ruled for c in classes)))
            for cls, held in fields.items()}


def _structs_in(info: Any) -> tuple[list[mi.StructType], list[mi.StructType]]:
    """The Struct types a field's value may be, and those its items may be when it is a list."""
    direct: list[mi.StructType] = []
    listed: list[mi.StructType] = []
    for member in _members(info):
        if isinstance(member, mi.StructType):
            direct.append(member)
        elif isinstance(member, mi.ListType):
            listed.extend(m for m in _members(member.item_type) if isinstance(m, mi.StructType))
    return direct, listed


def _members(info: Any) -> list[Any]:
    """`info` without its annotations, a union as its members."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        return [member for m in info.types for member in _members(m)]
    return [info]
