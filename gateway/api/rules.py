"""Rules across the fields of a request body, each declared once: the gateway checks decoded bodies
against it and /openapi.json states it, from the same object.

A field's own limits live in its type (gateway/api/types.py); a rule says what no single field's type
can: which fields go together (exactly one of prompt or input_ids; top_k only with output topk), a
value bounded by another's (num_return_sequences <= beam_width), emptiness across fields (a sample's
text and its query are not both empty). A request Struct lists its rules in `RULES`, and each rule
gives
  - `broken(body, where)`: the 400 message when `body`, the decoded Struct at path `where`, breaks
    it (None when it holds);
  - `schema()`: the same rule in JSON Schema (2020-12), added to the Struct's component, or None
    for the one rule JSON Schema cannot state (a value bounded by another field's: it has no
    comparison of two values, and spelling it out value by value is more than schema tools take);
  - `name`, `says` and its parameters: the rule in words and as data, listed under the component's
    `x-rules`, so that a client or a fuzzer reads every rule, that one included.
gateway/api/rule_check.py runs every rule of a body and of the Structs inside it (inner ones first).
tests/gateway/test_gateway_schema.py proves the two faces agree on generated and mutated bodies,
and that a body breaking each rule gets that rule's own 400.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.limits import Limits

Schema = dict[str, Any]


class Rule(Protocol):
    name: str
    """Stable id: the rule's kind and its fields (`exactly_one:prompt,input_ids`)."""

    @property
    def says(self) -> str:
        """The rule in one sentence, for the document."""

    def broken(self, body: Any, where: str) -> str | None:
        """The 400 message when the decoded `body` at `where` breaks the rule, else None."""

    def schema(self) -> Schema | None:
        """The rule in JSON Schema, for the object it is declared on; None where it cannot say it."""


def at(rule: Rule, limits: Limits) -> Rule:
    """The rule at a deployment: one whose parameter is a compiled bound (NotAbove's default) has its
    `at(limits)`; the others are the same everywhere."""
    bind = getattr(rule, "at", None)
    return rule if bind is None else bind(limits)


def schema_of(rules: tuple[Rule, ...], limits: Limits) -> Schema:
    """The keywords a Struct's component gets for its rules at a deployment (none for a Struct without rules)."""
    if not rules:
        return {}
    rules = tuple(at(rule, limits) for rule in rules)
    stated = [schema for schema in (rule.schema() for rule in rules) if schema is not None]
    return {**({"allOf": stated} if stated else {}), "x-rules": [described(rule) for rule in rules]}


def described(rule: Rule) -> dict[str, Any]:
    """A rule as data: its name, its sentence and its parameters (a When as its own fields)."""
    params = {k: v for k, v in dataclasses.asdict(rule).items() if k not in ("name", "says")}
    return {"rule": rule.name, "says": rule.says, **params}


def given(name: str) -> Schema:
    """JSON Schema: the field is present and not null (null stands for absent)."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def absent(name: str) -> Schema:
    """JSON Schema: the field is absent or null (`properties` holds of a field that is not there)."""
    return {"properties": {name: {"type": "null"}}}


def _is_given(body: Any, name: str) -> bool:
    return getattr(body, name) is not None


@dataclass(frozen=True)
class When:
    """A condition on one field: its value is one of `values` (absent or null counting as `default`)."""

    field: str
    values: tuple[str, ...]
    default: str | None = None

    def holds(self, body: Any) -> bool:
        value = getattr(body, self.field)
        return (self.default if value is None else value) in self.values

    def value(self, body: Any) -> Any:
        value = getattr(body, self.field)
        return self.default if value is None else value

    def schema(self) -> Schema:
        if self.default in self.values:  # absent and null take the default, which is allowed
            return {"properties": {self.field: {"enum": [*self.values, None]}}}
        return {"required": [self.field], "properties": {self.field: {"enum": list(self.values)}}}

    def __str__(self) -> str:
        return f"{self.field} {' or '.join(repr(v) for v in self.values)}"


@dataclass(frozen=True)
class ExactlyOne:
    """Exactly one of two fields is given (only while `when` holds, if it is set)."""

    first: str
    second: str
    when: When | None = None

    @property
    def name(self) -> str:
        return f"exactly_one:{self.first},{self.second}" + (f"|{self.when.field}" if self.when else "")

    @property
    def says(self) -> str:
        return f"exactly one of {self.first} or {self.second}" + (f", with {self.when}" if self.when else "")

    def broken(self, body: Any, where: str) -> str | None:
        if self.when is not None and not self.when.holds(body):
            return None
        count = _is_given(body, self.first) + _is_given(body, self.second)
        if count == 1:
            return None
        context = f"{self.when.field} {self.when.value(body)!r} needs" if self.when else "give"
        return (f"{context} exactly one of {where}.{self.first} or {where}.{self.second}"
                f" ({'both were given' if count else 'neither was given'})")

    def schema(self) -> Schema:
        one = {"oneOf": [given(self.first), given(self.second)]}
        return one if self.when is None else {"anyOf": [{"not": self.when.schema()}, one]}


@dataclass(frozen=True)
class OnlyWhen:
    """A field may be given only while a condition holds (top_k only with output topk)."""

    field: str
    when: When

    @property
    def name(self) -> str:
        return f"only_when:{self.field}|{self.when.field}"

    @property
    def says(self) -> str:
        return f"{self.field} only with {self.when}"

    def broken(self, body: Any, where: str) -> str | None:
        if not _is_given(body, self.field) or self.when.holds(body):
            return None
        return (f"{where}.{self.field} is only used with {self.when}, not {self.when.value(body)!r}; "
                "remove it")

    def schema(self) -> Schema:
        return {"anyOf": [absent(self.field), self.when.schema()]}


@dataclass(frozen=True)
class Excludes:
    """Two fields never go together (a sample's query with its token ids)."""

    field: str
    other: str
    why: str

    @property
    def name(self) -> str:
        return f"excludes:{self.field},{self.other}"

    @property
    def says(self) -> str:
        return f"not both {self.field} and {self.other} ({self.why})"

    def broken(self, body: Any, where: str) -> str | None:
        if _is_given(body, self.field) and _is_given(body, self.other):
            return f"{where}.{self.other} is not used with {where}.{self.field} ({self.why}); remove one"
        return None

    def schema(self) -> Schema:
        return {"not": {"allOf": [given(self.field), given(self.other)]}}


@dataclass(frozen=True)
class Distinct:
    """A list holds no value twice (labels: a repeated label would split its probability with itself).
    `scope` tells apart the same rule on another request shape (rule names are unique in the document)."""

    field: str
    scope: str = ""

    @property
    def name(self) -> str:
        return f"distinct:{self.field}" + (f"@{self.scope}" if self.scope else "")

    @property
    def says(self) -> str:
        return f"no entry of {self.field} twice"

    def broken(self, body: Any, where: str) -> str | None:
        seen: dict[Any, int] = {}
        for index, value in enumerate(getattr(body, self.field) or ()):
            if value in seen:
                return (f"{where}.{self.field}[{index}] = {value!r} repeats {where}.{self.field}[{seen[value]}]; "
                        "give each once")
            seen[value] = index
        return None

    def schema(self) -> Schema:
        return {"properties": {self.field: {"uniqueItems": True}}}


@dataclass(frozen=True)
class QueryUsed:
    """/v1/score: the request's query reaches a sample (a text without a query of its own); sent with
    none, it would be dropped without a word."""

    name: str = "query_used:query,samples"
    says: str = "a query is given only when some sample takes it: a text sample without a query of its own"

    def broken(self, body: Any, where: str) -> str | None:
        if body.query is None:
            return None
        if any(isinstance(item, str) or item.text is not None and item.query is None for item in body.samples):
            return None
        return (f"{where}.query goes before texts, but no sample takes it: every sample gives token ids or a query "
                "of its own; remove it, or put it into the token ids")

    def schema(self) -> Schema:
        takes = {"anyOf": [{"type": "string"}, {"type": "object", "allOf": [given("text"), absent("query")]}]}
        return {"anyOf": [absent("query"), {"properties": {"samples": {"contains": takes}}}]}


@dataclass(frozen=True)
class NotAbove:
    """One count may not exceed another (num_return_sequences <= beam_width), absent ones at their
    defaults. Stated in `x-rules` only: JSON Schema has no comparison of two values, and the exact
    list of every pair up to the bound is more than schema tools take (schemathesis' canonicaliser
    gave up on it from a few dozen values)."""

    field: str
    limit: str
    field_default: int
    limit_default: int
    limit_bound: str | None = None
    """A compiled bound that caps `limit_default` (beam_width's default: min(4, max_beam_width)); `at`
    writes the deployment's cap into limit_default."""

    @property
    def name(self) -> str:
        return f"not_above:{self.field},{self.limit}"

    def at(self, limits: Limits) -> NotAbove:
        if self.limit_bound is None or limits.limit(self.limit_bound) >= self.limit_default:
            return self  # the usual case, and the hot path: no copy
        return dataclasses.replace(self, limit_default=limits.limit(self.limit_bound))

    @property
    def says(self) -> str:
        return (f"{self.field} (default {self.field_default}) at most {self.limit} "
                f"(default {self.limit_default})")

    def broken(self, body: Any, where: str) -> str | None:
        value = getattr(body, self.field) or self.field_default
        limit = getattr(body, self.limit)
        if value <= (limit or self.limit_default):
            return None
        shown = f"{limit}" if limit is not None else f"{self.limit_default} (its default)"
        return f"{where}.{self.field} = {value} must not exceed {where}.{self.limit} = {shown}"

    def schema(self) -> None:
        return None


@dataclass(frozen=True)
class SampleTokens:
    """/v1/score: a text sample and its query (its own, else the request's) are not both empty."""

    name: str = "sample_tokens:samples"
    says: str = ("every text sample has tokens: its text or its query (the sample's own, else the "
                 "request's) is not empty")

    def broken(self, body: Any, where: str) -> str | None:
        for index, item in enumerate(body.samples):
            if isinstance(item, str):
                text, query = item, body.query
            elif item.input_ids is not None:
                continue
            else:
                text, query = item.text, body.query if item.query is None else item.query
            if not text and not query:
                return (f"{where}.samples[{index}]: the text and the query are both empty; every sample "
                        "needs at least one token")
        return None

    def schema(self) -> Schema:
        request_query = {"required": ["query"], "properties": {"query": {"type": "string", "minLength": 1}}}
        empty_with_own_query = {"type": "object", "required": ["text", "query"],
                                "properties": {"text": {"const": ""}, "query": {"const": ""}}}
        empty = {"type": "object", "required": ["text"], "properties": {"text": {"const": ""}, "query": {"enum": ["", None]}}}
        return {"anyOf": [
            {"allOf": [request_query, {"properties": {"samples": {"items": {"not": empty_with_own_query}}}}]},
            {"allOf": [{"not": request_query},
                       {"properties": {"samples": {"items": {"not": {"anyOf": [{"const": ""}, empty]}}}}}]}]}


def _items(body: Any) -> list[Any]:
    """SGLang's items: one text, or a list of texts or of token id lists."""
    return [body.items] if isinstance(body.items, str) else body.items


@dataclass(frozen=True)
class ItemsOfQueryKind:
    """SGLang's /v1/score: the items are texts with a text query and token id lists with an id
    query; without a query, of the first item's kind."""

    name: str = "same_kind:query,items"
    says: str = "items are of the query's kind: texts with a text query, token id lists with a token id query"

    def broken(self, body: Any, where: str) -> str | None:
        items = _items(body)
        reference = body.query if body.query is not None else items[0]
        text = isinstance(reference, str)
        kind, source = "text" if text else "token ids", "the query" if body.query is not None else f"{where}.items[0]"
        for index, item in enumerate(items):
            if isinstance(item, str) != text:
                wanted = "a string" if text else "a list of token ids"
                got = "a string" if isinstance(item, str) else "a list"
                return f"{where}.items[{index}] must be {wanted} because {source} is {kind}, got {got}"
        return None

    def schema(self) -> Schema:
        texts = {"properties": {"query": {"type": ["string", "null"]}, "items": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}}
        ids = {"properties": {"query": {"type": ["array", "null"]}, "items": {"type": "array", "items": {"type": "array"}}}}
        return {"anyOf": [texts, ids]}


@dataclass(frozen=True)
class ItemTokens:
    """SGLang's /v1/score: an item and the query are not both empty."""

    name: str = "item_tokens:query,items"
    says: str = "every item has tokens: it or the query is not empty"

    def broken(self, body: Any, where: str) -> str | None:
        if body.query:  # a query with tokens gives every item some
            return None
        for index, item in enumerate(_items(body)):
            if not item:
                return (f"{where}.items[{index}] and {where}.query are both empty; every item needs at least "
                        "one token")
        return None

    def schema(self) -> Schema:
        query = {"required": ["query"], "properties": {"query": {"not": {"type": "null"}, "minLength": 1, "minItems": 1}}}
        items = {"properties": {"items": {"not": {"const": ""}, "items": {"not": {"enum": ["", []]}}}}}
        return {"anyOf": [query, items]}
