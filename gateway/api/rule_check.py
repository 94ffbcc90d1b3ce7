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
        self._plans: dict[type, _Plan] = {}
        _plan_of(type_info(root), self._plans)

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


def _plan_of(info: mi.StructType, plans: dict[type, _Plan]) -> bool:
    """Plan the Struct `info` (and those below it) into `plans`; whether any rule is at or below it.
    A Struct class met again while planning (a type holding itself) counts as one without rules."""
    if info.cls in plans:
        return bool(plans[info.cls].rules or plans[info.cls].inner)
    plans[info.cls] = _Plan((), ())
    inner = []
    for field in info.fields:
        direct, listed = _structs_in(field.type)
        if any(_plan_of(struct, plans) for struct in direct):
            inner.append((field.name, False))
        if any(_plan_of(struct, plans) for struct in listed):
            inner.append((field.name, True))
    plans[info.cls] = _Plan(tuple(getattr(info.cls, "RULES", ())), tuple(inner))
    return bool(plans[info.cls].rules or inner)


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
