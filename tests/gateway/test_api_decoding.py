"""The decoder's checks after msgspec's parse, on the paths that skip work (gateway/api/rule_check.py,
repeated_fields.py): the rules of a Struct held in a field or a list, at any depth and before the
holder's own; a field named twice refused whether the body takes the quick proof or the full check
(a key spelled with escapes, a dict's keys, a list of numbers over several lines); a text that looks
like a key taken as it was sent."""

from __future__ import annotations

import json
from typing import ClassVar

import msgspec
import pytest

from gateway.api.completions import parse_completions
from gateway.api.generate import parse_generate
from gateway.api.repeated_fields import RepeatedFields
from gateway.api.rule_check import RuleCheck
from gateway.api.rules import ExactlyOne, Excludes, Rule
from gateway.api.score import parse_score
from gateway.errors import ApiError
from tests.gateway.test_gateway_schema import PLAIN


class Pair(msgspec.Struct, forbid_unknown_fields=True):
    RULES: ClassVar[tuple[Rule, ...]] = (ExactlyOne("a", "b"),)
    a: int | None = None
    b: int | None = None


class Bare(msgspec.Struct):
    """No rules itself, but holds a Pair and, through `next`, more of itself."""

    RULES: ClassVar[tuple[Rule, ...]] = ()
    pair: Pair | None = None
    next: Bare | None = None


class Holder(msgspec.Struct, forbid_unknown_fields=True):
    RULES: ClassVar[tuple[Rule, ...]] = (Excludes("first", "ids", "test"),)
    first: Pair | None = None
    items: list[str | Pair] = []
    ids: list[int] | None = None
    chain: Bare | None = None


def broken(body: dict) -> str | None:
    decoded = msgspec.json.decode(json.dumps(body).encode(), type=Holder)
    try:
        RuleCheck(Holder).check(decoded, PLAIN)
    except ApiError as error:
        assert error.status == 400
        return error.message
    return None


def test_a_struct_s_rules_are_checked_in_a_field_a_list_and_a_chain_of_itself_before_the_holder_s():
    assert broken({"first": {"a": 1}, "items": ["x", {"b": 2}], "chain": {"next": {"pair": {"a": 1}}}}) is None
    assert broken({"first": {}, "ids": [1]}) == "give exactly one of $.first.a or $.first.b (neither was given)"
    assert broken({"items": ["x", {"a": 1}, {"a": 1, "b": 2}], "first": {"a": 1}, "ids": [1]}) == (
        "give exactly one of $.items[2].a or $.items[2].b (both were given)")
    assert broken({"chain": {"next": {"next": {"pair": {}}}}}) == (
        "give exactly one of $.chain.next.next.pair.a or $.chain.next.next.pair.b (neither was given)")
    assert broken({"first": {"a": 1}, "ids": [1]}) == "$.ids is not used with $.first (test); remove one"


def test_a_sample_s_rule_is_answered_before_the_request_s():
    body = {"samples": ["x", {"input_ids": [1], "query": "q"}], "labels": ["yes"], "label_token_ids": [1]}
    with pytest.raises(ApiError) as refused:
        parse_score(json.dumps(body).encode(), PLAIN)
    assert refused.value.message.startswith("$.samples[1].query is not used with $.samples[1].input_ids")


def refusal(parse, raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse(raw, PLAIN)
    return refused.value


@pytest.mark.parametrize("parse, raw, name", [
    (parse_score, b'{"samples": ["a"], "labels": ["yes"], "labels": ["no"]}', "'labels' 2 times"),
    (parse_score, b'{"samples": ["a"], "\\u0073amples": ["b"], "labels": ["yes"]}', "'samples' 2 times"),
    (parse_generate, b'{"prompt": "a", "\\u0070rompt": "b"}', "'prompt' 2 times"),
    (parse_score, b'{"samples": [{"input_ids": [1,\n 2,\n -0]}], "label_token_ids": [1], "label_token_ids": [2]}',
     "'label_token_ids' 2 times"),
    (parse_generate, b'{"input_ids": [1, 2], "deadline_ms": 100, "deadline_ms": 200}', "'deadline_ms' 2 times"),
    (parse_completions, b'{"prompt": "a", "max_tokens": 0, "logit_bias": {"7": 1, "7": 2}}', "'7' 2 times"),
])
def test_a_field_named_twice_is_refused_on_every_path(parse, raw, name):
    error = refusal(parse, raw)
    assert (error.status, error.code) == (400, "invalid_request")
    assert name in error.message and "give each field once" in error.message


def test_texts_that_spell_keys_are_taken_as_sent():
    texts = ["labels", '"samples": ["x"]', "query", "{", "\\u0073amples"]
    spec = parse_score(json.dumps({"samples": texts, "labels": ["yes"]}).encode(), PLAIN)
    assert spec.samples == texts


def test_a_struct_that_keeps_unknown_fields_always_takes_the_full_check():
    class Open(msgspec.Struct):
        name: str = ""

    raw = b'{"name": "a", "other": 1, "other": 2}'
    with pytest.raises(ApiError, match="'other' 2 times"):
        RepeatedFields(Open).refuse(raw)
    RepeatedFields(Open).refuse(b'{"name": "a", "other": 1}')
