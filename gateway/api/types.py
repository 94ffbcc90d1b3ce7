"""The HTTP request bodies, declared once as msgspec Structs: the gateway decodes requests with them
(validated in C while the JSON is parsed; gateway/api/decoding.py) and /openapi.json is generated from
them (gateway/api/openapi.py). Answers are declared in gateway/api/answers.py.

A request type carries its deployment's limits in its constraints, so request types are built per
deployment (`request_types(limits)`, once). Limits are of two kinds:
- validity (a token id inside the vocabulary, deadline_ms up to max_deadline_ms, text length):
  outside them a request is malformed: 400 invalid_request;
- compiled bounds (samples per request, tokens per sample, labels, top_k, beam width, steps):
  above them a request is well formed but larger than what was compiled: 413 too_large. Each
  carries its 413 message (`extra["too_large"]`) and shows in the schema as `x-compiled-bound`;
  `request_types(limits, compiled_bounds=False)` leaves them out, so a decoder can tell the two apart.
Null stands for absent in every optional field (clients that serialize unset fields as null work).
Rules across fields that a type cannot state (exactly one of labels or label_token_ids, ...) are
declared once, in each type's `RULES` (gateway/api/rules.py): the decoder checks them and the
schema states them.
"""

# No `from __future__ import annotations`: the Structs below are made inside functions, and msgspec
# reads their annotations, which name those functions' local types, when each class is made.
import functools
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta, Struct

from gateway.api.rules import (Distinct, ExactlyOne, Excludes, ItemsOfQueryKind, ItemTokens, NotAbove, OnlyWhen, Rule,
                                QueryUsed, SampleTokens, When)
from gateway.limits import Limits
from shared.bounds import rule_words

MAX_TEXT_CHARS = 1 << 20
"""Longest text field (characters); the body size limit (max_body_bytes) applies as well."""
MAX_MODEL_CHARS = 256
OUTPUTS = ("probs", "logprobs", "logits", "topk", "embedding")
LABEL_OUTPUTS = ("probs", "logprobs", "logits")
DEFAULT_OUTPUT = "probs"
LABELLED = When("output", LABEL_OUTPUTS, DEFAULT_OUTPUT)
"""The outputs read at label tokens, which need labels (or their ids)."""
DEFAULT_BEAM_WIDTH = 4
"""beam_width when a request leaves it out (or the compiled bound, if smaller)."""
PRIORITY_HELP = ("Larger is more important: under overload lower priorities are refused or shed first; "
                 "within a priority, deadlines order the queue. X-Priority also sets it (they must agree). "
                 "Default 0.")
DEADLINE_HELP = ("Budget in ms from arrival; X-Deadline-Ms and x-envoy-expected-rq-timeout-ms also count "
                 "(the smallest wins), else the route default.")


def _words(bound: str, field: str) -> str:
    """A token-count bound's 413 words about `field` (shared/bounds.py's rule), filled in on decoding."""
    return rule_words(bound, "{count}", "{bound}", part=field)


@dataclass(frozen=True)
class RequestTypes:
    """The request Structs of one deployment."""

    score: type[Struct]
    sglang_score: type[Struct]
    generate: type[Struct]
    structs: tuple[type[Struct], ...]
    """Every Struct above and those they hold (their `RULES` go into the schema)."""


@functools.lru_cache(maxsize=16)
def request_types(limits: Limits, compiled_bounds: bool = True) -> RequestTypes:
    """The request bodies this deployment takes; without `compiled_bounds`, only the validity limits."""
    fields = _Fields(limits, compiled_bounds)
    sample, score = _score_request(fields)
    sglang = _sglang_score_request(fields)
    generate = _generate_request(fields, limits.constraints)
    return RequestTypes(score, sglang, generate, (sample, score, sglang, generate))


class _Fields:
    """The constrained field types of one deployment, which the request Structs are made of."""

    def __init__(self, limits: Limits, compiled_bounds: bool) -> None:
        self.limits, self.compiled_bounds = limits, compiled_bounds
        self.token_id = Annotated[int, Meta(ge=0, le=limits.vocab_size - 1, extra={"noun": "token id"})]
        self.text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
        self.deadline = Annotated[int, Meta(ge=1, le=limits.max_deadline_ms, description=DEADLINE_HELP)]
        self.priority = Annotated[int, Meta(ge=limits.min_priority, le=limits.max_priority, description=PRIORITY_HELP)]
        self.label_ids = Annotated[list[self.token_id], Meta(min_length=1, description="Label token ids."),
                                   self.bound("max_labels", "label_token_ids holds {count} ids; at most {bound} "
                                                            "are compiled")]

    def bound(self, limit: str, too_large: str, key: str = "max_length") -> Meta:
        """`limits.<limit>` as a compiled bound on a length (max_length) or a value (le)."""
        if not self.compiled_bounds:
            return Meta()
        return Meta(**{key: self.limits.limit(limit)}, extra={"too_large": too_large},
                    extra_json_schema={"x-compiled-bound": limit})

    def ids(self, limit: str, too_large: str, min_length: int | None = 1) -> Any:
        """A list of token ids, at most the compiled bound `limit` long."""
        return Annotated[list[self.token_id], Meta(min_length=min_length), self.bound(limit, too_large)]

    def count(self, limit: str, what: str) -> Any:
        """A positive integer up to a compiled bound (e.g. top_k); absent or null: the default."""
        too_large = f"{{name}} = {{value}} is over the compiled bound of {{bound}} {what}"
        return Annotated[int, Meta(ge=1), self.bound(limit, too_large, "le")] | None


def _score_request(f: _Fields) -> tuple[type[Struct], type[Struct]]:
    class SampleObject(Struct, forbid_unknown_fields=True):
        """One sample: text (with a query of its own, else the request's) or token ids."""

        RULES: ClassVar[tuple[Rule, ...]] = (
            ExactlyOne("text", "input_ids"),
            Excludes("input_ids", "query", "a query goes before a text; token ids are sent whole"))
        text: f.text | None = None
        query: f.text | None = None
        input_ids: f.ids("max_tokens_per_sample", _words("max_tokens_per_sample", "sample {index}")) | None = None

    class ScoreRequest(Struct, forbid_unknown_fields=True):
        """Score samples (prefill only): label probabilities, top-k tokens or embeddings."""

        RULES: ClassVar[tuple[Rule, ...]] = (
            ExactlyOne("labels", "label_token_ids", when=LABELLED),
            OnlyWhen("labels", LABELLED),
            OnlyWhen("label_token_ids", LABELLED),
            OnlyWhen("top_k", When("output", ("topk",), DEFAULT_OUTPUT)),
            Distinct("labels"),
            Distinct("label_token_ids"),
            SampleTokens(),
            QueryUsed())
        samples: Annotated[list[f.text | SampleObject], Meta(min_length=1), f.bound(
            "max_samples_per_request", "samples holds {count} samples; this deployment takes at most {bound} "
            "per request")]
        labels: Annotated[list[f.text], Meta(min_length=1, description="Each must be exactly one token."),
                          f.bound("max_labels", "labels holds {count} entries; at most {bound} are compiled")
                          ] | None = None
        label_token_ids: f.label_ids | None = None
        output: Literal[OUTPUTS] | None = DEFAULT_OUTPUT
        top_k: f.count("max_top_k", "tokens") = None
        query: Annotated[f.text, Meta(description="Fills {query} of the prompt template, else prefixes each "
                                                  "text.")] | None = None
        deadline_ms: f.deadline | None = None
        priority: f.priority | None = None

    return SampleObject, ScoreRequest


def _sglang_score_request(f: _Fields) -> type[Struct]:
    class SglangScoreRequest(Struct, forbid_unknown_fields=True):
        """SGLang's /v1/score body, accepted unchanged: the query joined to each item, as text or
        token ids alike; answered in SGLang's shape."""

        RULES: ClassVar[tuple[Rule, ...]] = (ItemsOfQueryKind(), ItemTokens(), Distinct("label_token_ids", "sglang"))
        items: f.text | Annotated[
            list[f.text | f.ids("max_tokens_per_sample", _words("max_tokens_per_sample", "items[{index}]"),
                                       min_length=None)],
            Meta(min_length=1), f.bound("max_samples_per_request", "items holds {count} items; at most {bound} "
                                                                   "per request")]
        label_token_ids: f.label_ids
        query: f.text | f.ids("max_tokens_per_sample", _words("max_tokens_per_sample", "query"),
                              min_length=None) | None = None
        apply_softmax: bool | None = False
        item_first: bool | None = False
        model: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=(
            "Echoed in the answer (default 'default'); this gateway serves one model and does not route "
            "on it."))] | None = None
        deadline_ms: f.deadline | None = None
        priority: f.priority | None = None

    return SglangScoreRequest


def _generate_request(f: _Fields, constraint_set: str | None) -> type[Struct]:
    default_width = min(DEFAULT_BEAM_WIDTH, f.limits.bounds.max_beam_width)
    constraint = Literal[constraint_set] | None if constraint_set else Annotated[None, Meta(extra={
        "hint": "this deployment has no constraint set; remove the field"})]
    catalog_name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$", description=(
        "The loaded catalogue (e.g. a market) to decode in; default: the one [beam] constraints names."))] | None \
        if constraint_set else Annotated[None, Meta(extra={"hint": "this deployment decodes unconstrained; remove "
                                                                     "the field"})]

    class GenerateRequest(Struct, forbid_unknown_fields=True):
        """Bounded beam search: the best continuations of a prompt. Give exactly one of prompt or
        input_ids; num_return_sequences must not exceed beam_width (default min(4, the bound))."""

        RULES: ClassVar[tuple[Rule, ...]] = (
            ExactlyOne("prompt", "input_ids"),
            NotAbove("num_return_sequences", "beam_width", field_default=1, limit_default=default_width))
        prompt: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)] | None = None
        input_ids: f.ids("max_prompt_tokens", _words("max_prompt_tokens", "input_ids")) | None = None
        beam_width: f.count("max_beam_width", "beams") = None
        max_new_tokens: f.count("max_new_tokens", "decode steps") = None
        num_return_sequences: f.count("max_beam_width", "beams") = None
        constraints: constraint = None
        catalog: catalog_name = None
        deadline_ms: f.deadline | None = None
        priority: f.priority | None = None

    return GenerateRequest
