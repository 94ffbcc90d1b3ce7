"""The generated /openapi.json and the gateway's request decoders agree.

Valid: every body schemathesis generates from the document is accepted. Invalid: a generated body
is mutated at one place (a value replaced, a list grown past a bound, a field added or removed);
the document itself (jsonschema) says whether the result is still valid, and the parser must say
the same: accepted, or refused with 400 (413 exactly when nothing but a compiled bound is exceeded)
and a message naming the mutated field's path (or a parent's), e.g. `$.samples[3].input_ids[0]`.

The rules across fields are declared once (gateway/api/rules.py, each type's RULES): the document
states each one, and a body breaking it gets its own 400. JSON Schema states every rule of these
bodies but one, tested here by hand: an integer is written as one (JSON Schema counts 2.0 as an
integer; the gateway refuses it and says where).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gateway.api.rules import schema_of
from gateway.errors import ApiError
from gateway.api.completions import CompletionRequest
from gateway.api.generate import parse_generate
from gateway.api.types import MAX_TEXT_CHARS, STRUCTS
from gateway.limits import Limits
from gateway.api.openapi import openapi_document
from gateway.api.score import parse_score
from shared.bounds import score_problem
from shared.manifest import Manifest
from shared.work import WorkSize
from tests.gateway.conftest import deployment, endpoint
from loadgen.standin_worker import BOUNDS

VOCAB = 1024
PLAIN = Limits.of(deployment([endpoint()]), Manifest(bounds=BOUNDS), VOCAB)
LIMITS = [PLAIN, dataclasses.replace(PLAIN, constraints="catalog", max_samples_per_request=8,
                                          bounds=dataclasses.replace(PLAIN.bounds, max_labels=3))]
PARSERS = {"POST /v1/score": parse_score, "POST /v1/generate": parse_generate}
PATH = re.compile(r"\$(?:\.[A-Za-z_]\w*|\[\d+\])*")
SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "database": None, "derandomize": True}


class Contract:
    """One deployment's document, its operations, and validators for each request type."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.doc = openapi_document(limits)
        schema = schemathesis.openapi.from_dict(self.doc)
        self.operations = {op.label: op for op in (r.ok() for r in schema.get_all_operations())}
        self.full = {name: self._validator(name, self.doc["components"]) for name in self._requests()}
        fields_only = copy.deepcopy(self.doc["components"])
        for struct in STRUCTS:  # without the rules across fields
            for key in schema_of(struct.RULES, limits):
                del fields_only["schemas"][struct.__name__][key]
        self.fields_only = {name: self._validator(name, fields_only) for name in self._requests()}

    @staticmethod
    def _requests() -> tuple[str, ...]:
        return ("ScoreRequest", "SglangScoreRequest", "GenerateRequest")

    @staticmethod
    def _validator(name: str, components: dict) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": components})

    def breaks_a_comparison(self, kind: str, body: object) -> bool:
        """Whether `body` breaks a rule JSON Schema cannot state, as the document's x-rules give it
        (not_above: one field's value, or its default, at most another's)."""
        for rule in self.doc["components"]["schemas"][kind].get("x-rules", []):
            if rule["rule"].startswith("not_above:") and isinstance(body, dict):
                value = body.get(rule["field"]) or rule["field_default"]
                limit = body.get(rule["limit"]) or rule["limit_default"]
                if all(type(v) is int for v in (value, limit)) and value > limit:
                    return True
        return False

    @staticmethod
    def request_type(label: str, body: object) -> str:
        """Which type the parser decodes `body` as (it tells the /v1/score shapes apart by key)."""
        if label == "POST /v1/generate":
            return "GenerateRequest"
        if label == "POST /v1/completions":
            return "CompletionRequest"
        is_sglang = isinstance(body, dict) and "items" in body and "samples" not in body
        return "SglangScoreRequest" if is_sglang else "ScoreRequest"


CONTRACTS = [Contract(limits) for limits in LIMITS]


def integers_as_integers(value):
    """JSON Schema's integers include 2.0; the gateway takes integers written as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integers_as_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: integers_as_integers(v) for k, v in value.items()}
    return value


def parse(label: str, body: object, limits: Limits):
    return PARSERS[label](json.dumps(body).encode(), limits)


@pytest.mark.parametrize("contract", CONTRACTS, ids=["plain", "constraints"])
@pytest.mark.parametrize("label", PARSERS)
def test_every_body_the_schema_allows_is_accepted(contract, label):
    @given(case=contract.operations[label].as_strategy())
    @settings(max_examples=150, **SETTINGS)
    def run(case):
        body = integers_as_integers(case.body)
        kind = contract.request_type(label, body)
        assert contract.full[kind].is_valid(body), body
        if contract.breaks_a_comparison(kind, body):
            with pytest.raises(ApiError) as refused:
                parse(label, body, contract.limits)
            assert refused.value.status == 400 and "must not exceed" in refused.value.message
            return
        parse(label, body, contract.limits)  # an ApiError here is a disagreement

    run()


def locations(value, steps=()):
    """Every (path steps, value) inside a JSON value, the root included."""
    yield steps, value
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from locations(child, (*steps, key))


def path_text(steps) -> str:
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)


def replacement_values(limits: Limits):
    edges = [-1, 0, 1, 2, 4, 5, VOCAB - 1, VOCAB, limits.bounds.max_top_k + 1, limits.bounds.max_beam_width + 1,
             limits.max_deadline_ms + 1, 2**63, 2**70, -(2**70)]
    return st.one_of(st.none(), st.booleans(), st.sampled_from(edges), st.integers(),
                     st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
                     st.text(min_size=1, max_size=5), st.just(""), st.just([]), st.just({}),
                     st.lists(st.integers(-2, VOCAB + 1), min_size=1, max_size=3))


@st.composite
def mutated(draw, body, limits: Limits):
    """(path steps of the mutation, the mutated body)."""
    steps, value = draw(st.sampled_from(list(locations(body))))
    kinds = ["replace"] + (["grow"] if isinstance(value, list) and value else []) + (
        ["add", "remove"] if isinstance(value, dict) else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "replace":
        new = draw(replacement_values(limits))
    elif kind == "grow":
        bounds = limits.bounds
        sizes = {bounds.max_labels + 1, limits.max_samples_per_request + 1, bounds.max_tokens_per_sample + 1}
        new = [value[0]] * draw(st.sampled_from(sorted(sizes)))
    else:
        new = dict(value)
        if kind == "add" or not value:
            name = draw(st.sampled_from(["colour", "samples", "items", "labels", "label_token_ids", "output",
                                         "top_k", "query", "text", "input_ids", "prompt", "model"]))
            new[name] = draw(replacement_values(limits))
        else:
            name = draw(st.sampled_from(sorted(value)))
            del new[name]
        steps = (*steps, name)
    return steps, _put(body, list(steps[: len(steps) - (kind in ("add", "remove"))]), new)


def _put(body, steps, new):
    if not steps:
        return new
    copied = copy.copy(body)
    copied[steps[0]] = _put(body[steps[0]], steps[1:], new)
    return copied


def bound_only(error) -> bool:
    """Whether a jsonschema error is only a compiled bound exceeded (x-compiled-bound)."""
    if error.validator in ("maximum", "maxItems"):
        return "x-compiled-bound" in error.schema
    if error.validator in ("anyOf", "oneOf") and error.context:
        # Some branch refused by a compiled bound alone (e.g. an integer over its maximum, where the
        # other branch is null); a branch that also fails its type (128.5 for an integer) does not count.
        branches: dict[int, list] = {}
        for e in error.context:
            branches.setdefault(e.relative_schema_path[0], []).append(e)
        return any(all(bound_only(e) for e in errs) for errs in branches.values())
    return False


def related(a: str, b: str) -> bool:
    """One path is the other or inside it."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((short + ".", short + "["))


@pytest.mark.parametrize("contract", CONTRACTS, ids=["plain", "constraints"])
@pytest.mark.parametrize("label", PARSERS)
def test_a_body_mutated_at_one_field_is_judged_as_the_schema_judges_it(contract, label):
    limits = contract.limits

    @given(case=contract.operations[label].as_strategy(), data=st.data())
    @settings(max_examples=300, **SETTINGS)
    def run(case, data):
        steps, body = data.draw(mutated(integers_as_integers(case.body), limits))
        kind = contract.request_type(label, body)
        errors = list(contract.full[kind].iter_errors(body))
        compared = contract.breaks_a_comparison(kind, body)
        if not errors and not compared:
            parse(label, body, limits)
            return
        with pytest.raises(ApiError) as refused:
            parse(label, body, limits)
        message = refused.value.message
        over_bound_only = all(map(bound_only, errors)) and not compared
        assert refused.value.status == (413 if over_bound_only else 400), message  # malformed first: 400
        named = PATH.findall(message)
        assert named, message
        # A malformed field is answered first, naming it; then a rule across fields (naming those
        # fields); then a compiled bound exceeded (413), naming the field again.
        malformed = any(not bound_only(e) for e in contract.fields_only[kind].iter_errors(body))
        if malformed or refused.value.status == 413:
            assert any(related(p, path_text(steps)) for p in named), (path_text(steps), message)

    run()


@pytest.mark.parametrize("raw, words", [
    (b'{"samples": ["x"], "output": "topk", "top_k": 2.0}', ["$.top_k", "2.0", "integer"]),
    (b'{"samples": [{"input_ids": [1, true]}], "label_token_ids": [1]}', ["$.samples[0].input_ids[1]", "true"]),
    (b'{"samples": ["x"], "output": "topk", "top_k": 1e999}', ["$.top_k", "integer"]),
    (b'{"samples": ["x"], "labels": ["a"], "deadline_ms": NaN}', ["not valid JSON"]),
    (b'{"samples": ["x"], "labels": ["a"], "deadline_ms": Infinity}', ["not valid JSON"]),
    (b'{"samples": ["\\ud800"], "labels": ["a"]}', ["not valid JSON", "surrogate"]),
    (b'{"samples": ["x"], "labels": ["a"], "deadline_ms": 123456789012345678901234567890}',
     ["$.deadline_ms", "between 1 and"]),
    (b'{"samples": [' + b"[" * 5000 + b"]" * 5000 + b'], "labels": ["a"]}', ["$.samples[0]"]),
    (b'{"samples": ["x"], "labels": ["a"], "colour": ' + b"[" * 5000 + b"]" * 5000 + b"}", ["colour"]),
    (b'{"samples": [], "labels": ["a"]}', ["$.samples", "non-empty list"]),
    (b'{"samples": ["x"], "labels": []}', ["$.labels", "non-empty list"]),
    (b'{"items": [], "label_token_ids": [1]}', ["$.items", "non-empty list"]),
    (b'{"samples": ["x"], "label_token_ids": [1, 1024]}', ["$.label_token_ids[1] = 1024", "1023"]),
    (b'{"samples": [{"input_ids": [1], "query": "q"}], "label_token_ids": [1]}', ["$.samples[0]", "input_ids"]),
    (b'[1, 2]', ["the request body ($)", "object"]),
    (b'"text"', ["the request body ($)", "object"]),
])
def test_malformed_bodies_get_400_naming_the_field(raw, words):
    with pytest.raises(ApiError) as refused:
        parse_score(raw, PLAIN)
    assert refused.value.status == 400, refused.value.message
    for word in words:
        assert word in refused.value.message, refused.value.message


def test_a_rule_across_fields_is_answered_400_before_a_compiled_bound_413():
    body = json.dumps({"samples": ["x"], "labels": ["yes"], "top_k": PLAIN.bounds.max_top_k + 1}).encode()
    with pytest.raises(ApiError) as refused:
        parse_score(body, PLAIN)  # top_k is over its bound, and not used with output 'probs' at all
    assert refused.value.status == 400 and "$.top_k is only used with output 'topk'" in refused.value.message
    body = json.dumps({"prompt": "x", "beam_width": 2,
                       "num_return_sequences": PLAIN.bounds.max_beam_width + 1}).encode()
    with pytest.raises(ApiError) as refused:
        parse_generate(body, PLAIN)
    assert refused.value.status == 400 and "must not exceed $.beam_width = 2" in refused.value.message


def test_generate_beam_rules_and_constraints():
    with pytest.raises(ApiError) as refused:
        parse_generate(b'{"prompt": "x", "beam_width": 2, "num_return_sequences": 3}', PLAIN)
    assert refused.value.status == 400 and "$.num_return_sequences = 3" in refused.value.message
    with pytest.raises(ApiError) as refused:
        parse_generate(b'{"prompt": "x", "constraints": "catalog"}', PLAIN)
    assert "$.constraints" in refused.value.message and "no constraint set" in refused.value.message
    assert parse_generate(b'{"prompt": "x", "constraints": "catalog"}', LIMITS[1]).prompt == "x"


def test_one_declaration_of_each_limit_serves_parser_and_schema():
    """The hand-written schema said 4096 characters and 64 query ids while the parser took 1 MiB and
    any number; now the document shows what the decoder enforces."""
    schemas = openapi_document(PLAIN)["components"]["schemas"]
    query = schemas["SglangScoreRequest"]["properties"]["query"]["anyOf"]
    assert {"type": "string", "maxLength": MAX_TEXT_CHARS} in query
    ids = next(s for s in query if s.get("type") == "array")
    assert ids["maxItems"] == PLAIN.bounds.max_tokens_per_sample and ids["x-compiled-bound"] == "max_tokens_per_sample"
    def sglang(item: str) -> bytes:
        return json.dumps({"items": [item], "query": "x", "label_token_ids": [1]}).encode()

    assert parse_score(sglang("é" * MAX_TEXT_CHARS), PLAIN).samples == ["x" + "é" * MAX_TEXT_CHARS]
    with pytest.raises(ApiError) as refused:
        parse_score(sglang("q" * (MAX_TEXT_CHARS + 1)), PLAIN)
    assert refused.value.status == 400 and "$.items[0]" in refused.value.message
    query_ids = json.dumps({"items": [[1]], "query": [2] * (PLAIN.bounds.max_tokens_per_sample + 1),
                            "label_token_ids": [1]}).encode()
    with pytest.raises(ApiError) as refused:
        parse_score(query_ids, PLAIN)
    assert refused.value.status == 413 and "$.query" in refused.value.message


def test_token_ids_and_text_over_the_sample_bound_get_the_same_words():
    """Ids over the bound are refused while decoding, text once tokenized (gateway/scoring.py); both
    say it in shared/bounds.py's words for the rule."""
    over = PLAIN.bounds.max_tokens_per_sample + 1
    body = json.dumps({"samples": ["x", {"input_ids": [1] * over}], "label_token_ids": [1]}).encode()
    with pytest.raises(ApiError) as refused:
        parse_score(body, PLAIN)
    words = score_problem(PLAIN.bounds, WorkSize(0, (over,)).shape()).message(part="sample 1", name_bound=False)
    assert refused.value.status == 413 and refused.value.message.startswith(words + " (at $.samples[1].input_ids")


# Every rule across fields the gateway enforces, by its name in /openapi.json's x-rules: a body that
# breaks it (and nothing else), and the words of its own 400.
RULE_BREAKERS = {
    "exactly_one:text,input_ids": ("/v1/score", {"samples": [{"query": "q"}], "label_token_ids": [1]},
                                   "give exactly one of $.samples[0].text or $.samples[0].input_ids (neither"),
    "excludes:input_ids,query": ("/v1/score", {"samples": [{"input_ids": [1], "query": "q"}], "label_token_ids": [1]},
                                 "$.samples[0].query is not used with $.samples[0].input_ids"),
    "exactly_one:labels,label_token_ids|output": (
        "/v1/score", {"samples": ["x"], "labels": ["yes"], "label_token_ids": [1]},
        "output 'probs' needs exactly one of $.labels or $.label_token_ids (both were given)"),
    "only_when:labels|output": ("/v1/score", {"samples": ["x"], "output": "topk", "labels": ["yes"]},
                                "$.labels is only used with output 'probs' or 'logprobs' or 'logits', not 'topk'"),
    "only_when:label_token_ids|output": (
        "/v1/score", {"samples": ["x"], "output": "embedding", "label_token_ids": [1]},
        "$.label_token_ids is only used with output 'probs' or 'logprobs' or 'logits', not 'embedding'"),
    "only_when:top_k|output": ("/v1/score", {"samples": ["x"], "labels": ["yes"], "top_k": 2},
                               "$.top_k is only used with output 'topk', not 'probs'"),
    "sample_tokens:samples": ("/v1/score", {"samples": ["x", {"text": "", "query": ""}], "labels": ["yes"],
                                            "query": "q"},
                              "$.samples[1]: the text and the query are both empty"),
    "distinct:labels": ("/v1/score", {"samples": ["x"], "labels": ["yes", "no", "yes"]},
                        "$.labels[2] = 'yes' repeats $.labels[0]; give each once"),
    "distinct:label_token_ids": ("/v1/score", {"samples": ["x"], "label_token_ids": [4, 4]},
                                 "$.label_token_ids[1] = 4 repeats $.label_token_ids[0]"),
    "query_used:query,samples": ("/v1/score", {"samples": [{"input_ids": [1]}, {"text": "a", "query": "b"}],
                                               "labels": ["yes"], "query": "q"},
                                 "$.query goes before texts, but no sample takes it"),
    "distinct:label_token_ids@sglang": ("/v1/score", {"items": ["a"], "label_token_ids": [4, 4]},
                                        "$.label_token_ids[1] = 4 repeats $.label_token_ids[0]"),
    "same_kind:query,items": ("/v1/score", {"items": ["a"], "query": [1], "label_token_ids": [1]},
                              "$.items[0] must be a list of token ids because the query is token ids, got a string"),
    "item_tokens:query,items": ("/v1/score", {"items": ["a", ""], "label_token_ids": [1]},
                                "$.items[1] and $.query are both empty"),
    "exactly_one:prompt,input_ids": ("/v1/generate", {"prompt": "x", "input_ids": [1]},
                                     "give exactly one of $.prompt or $.input_ids (both were given)"),
    "not_above:num_return_sequences,beam_width": (
        "/v1/generate", {"prompt": "x", "num_return_sequences": 5},
        "$.num_return_sequences = 5 must not exceed $.beam_width = 4 (its default)"),
    "one_kind:prompt": ("/v1/completions", {"prompt": ["a", [1]]}, "$.prompt mixes strings, token ids"),
    "greedy:temperature,top_p,max_tokens": ("/v1/completions", {"prompt": "x", "max_tokens": 1, "temperature": 0.5},
                                            "$.temperature = 0.5: this gateway does not sample"),
    "not_above:n,best_of": ("/v1/completions", {"prompt": "x", "max_tokens": 2, "n": 3, "best_of": 2},
                            "$.n = 3 must not exceed $.best_of = 2"),
    "one_answer:n,best_of,max_tokens": ("/v1/completions", {"prompt": "x", "max_tokens": 0, "n": 2},
                                        "with max_tokens 0: a prompt scored without generating has one answer"),
    **{f"unsupported:{field}": ("/v1/completions", {"prompt": "x", field: value}, f"$.{field} = ")
       for field, value in (("stream", True), ("stream_options", {"include_usage": True}), ("stop", ["\n"]),
                            ("suffix", "s"), ("logit_bias", {"1": 2.0}), ("presence_penalty", 1.0),
                            ("frequency_penalty", 1.0))},
}


async def test_the_served_document_states_every_rule_and_each_broken_rule_gets_its_own_400(stack):
    response = await stack.client.get("/openapi.json")
    schemas = (await response.json())["components"]["schemas"]
    structs = (*STRUCTS, CompletionRequest)
    documented = {}  # the other standard routes' rules: tests/gateway/test_api_openapi.py
    for name, schema in schemas.items():
        for rule in schema.get("x-rules", []) if name in {struct.__name__ for struct in structs} else ():
            documented[rule["rule"]] = name
    declared = {rule.name: struct for struct in structs for rule in struct.RULES}
    assert set(documented) == set(declared) == set(RULE_BREAKERS)
    for name, struct in declared.items():  # in JSON Schema too, wherever JSON Schema can say it
        rule = next(r for r in struct.RULES if r.name == name)
        assert documented[name] == struct.__name__
        assert rule.schema() is None or rule.schema() in schemas[struct.__name__]["allOf"], name
    for name, (route, body, words) in RULE_BREAKERS.items():
        status, answer, _ = await stack.post(route, body)
        assert status == 400 and answer["error"]["code"] == "invalid_request", (name, answer)
        assert words in answer["error"]["message"], (name, answer["error"]["message"])
        kind = Contract.request_type(f"POST {route}", body)  # the document says it is invalid too
        valid = Draft202012Validator({"$ref": f"#/components/schemas/{kind}", "components": {"schemas": schemas}})
        assert valid.is_valid(body) == name.startswith("not_above:"), name  # that one in x-rules only
