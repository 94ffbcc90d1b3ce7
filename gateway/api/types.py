"""The HTTP request bodies, declared once, at import, as msgspec Structs: the gateway decodes requests
with them (validated in C while the JSON is parsed; gateway/api/decoding.py) and /openapi.json is
generated from them (gateway/api/openapi.py). Answers are declared in gateway/api/answers.py.

A body's shape is the same in every deployment; what a deployment changes is a field's limits, and
those are declared beside the field as `Limit`s (gateway/api/limit.py), checked after decoding in one
walk (gateway/api/limit_check.py) and filled into the document. Limits are of two kinds:
- validity (a token id inside the vocabulary, deadline_ms up to max_deadline_ms, a priority inside
  its bounds, a constraint set the deployment has): outside them a request is malformed: 400
  invalid_request;
- compiled bounds (samples per request, tokens per sample, labels, top_k, beam width, steps):
  above them a request is well formed but larger than what was compiled: 413 too_large. Each
  carries its 413 message and shows in the schema as `x-compiled-bound`.
Null stands for absent in every optional field (clients that serialize unset fields as null work).
Rules across fields that a type cannot state (exactly one of labels or label_token_ids, ...) are
declared once, in each type's `RULES` (gateway/api/rules.py): the decoder checks them and the
schema states them.
"""

from typing import Annotated, ClassVar, Literal

from msgspec import Meta, Struct

from gateway.api.limit import Limit, limited
from gateway.api.rules import (Distinct, ExactlyOne, Excludes, ItemsOfQueryKind, ItemTokens, NotAbove, OnlyWhen, Rule,
                                QueryUsed, SampleTokens, When)
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


def compiled(limit: str, too_large: str, keyword: str = "max_length") -> Limit:
    """The compiled bound `limit` on a length (max_length) or a value (le), refused with `too_large` (413)."""
    return Limit(limit, keyword, too_large=too_large)


Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
TokenId = Annotated[int, limited(Limit("vocab_size", "le", offset=-1), ge=0, extra={"noun": "token id"})]
DeadlineMs = Annotated[int, limited(Limit("max_deadline_ms", "le"), ge=1, description=DEADLINE_HELP)]
Priority = Annotated[int, limited(Limit("min_priority", "ge"), Limit("max_priority", "le"), description=PRIORITY_HELP)]
LabelIds = Annotated[list[TokenId], limited(compiled("max_labels", "label_token_ids holds {count} ids; at most {bound} "
                                                                   "are compiled"),
                                            min_length=1, description="Label token ids.")]


def token_ids(limit: str, too_large: str, min_length: int | None = 1) -> object:
    """A list of token ids, at most the compiled bound `limit` long."""
    return Annotated[list[TokenId], limited(compiled(limit, too_large), min_length=min_length)]


def count(limit: str, what: str) -> object:
    """A positive integer up to a compiled bound (e.g. top_k); absent or null: the default."""
    too_large = f"{{name}} = {{value}} is over the compiled bound of {{bound}} {what}"
    return Annotated[int, limited(compiled(limit, too_large, "le"), ge=1)] | None


def per_request(too_large: str, item: object) -> object:
    """A non-empty list of `item`s, at most the deployment's max_samples_per_request long."""
    return Annotated[list[item], limited(compiled("max_samples_per_request", too_large), min_length=1)]


SampleIds = token_ids("max_tokens_per_sample", _words("max_tokens_per_sample", "sample {index}"))
ItemIds = token_ids("max_tokens_per_sample", _words("max_tokens_per_sample", "items[{index}]"), min_length=None)
QueryIds = token_ids("max_tokens_per_sample", _words("max_tokens_per_sample", "query"), min_length=None)
PromptIds = token_ids("max_prompt_tokens", _words("max_prompt_tokens", "input_ids"))
Labels = Annotated[list[Text], limited(compiled("max_labels", "labels holds {count} entries; at most {bound} are "
                                                              "compiled"),
                                       min_length=1, description="Each must be exactly one token.")]
Query = Annotated[Text, Meta(description="Fills {query} of the prompt template, else prefixes each text.")]
TopK = count("max_top_k", "tokens")
BeamWidth = count("max_beam_width", "beams")
NewTokens = count("max_new_tokens", "decode steps")
SglangItems = per_request("items holds {count} items; at most {bound} per request", Text | ItemIds)


class SampleObject(Struct, forbid_unknown_fields=True):
    """One sample: text (with a query of its own, else the request's) or token ids."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        ExactlyOne("text", "input_ids"),
        Excludes("input_ids", "query", "a query goes before a text; token ids are sent whole"))
    text: Text | None = None
    query: Text | None = None
    input_ids: SampleIds | None = None


Samples = per_request("samples holds {count} samples; this deployment takes at most {bound} per request",
                      Text | SampleObject)


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
    samples: Samples
    labels: Labels | None = None
    label_token_ids: LabelIds | None = None
    output: Literal[OUTPUTS] | None = DEFAULT_OUTPUT
    top_k: TopK = None
    query: Query | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


class SglangScoreRequest(Struct, forbid_unknown_fields=True):
    """SGLang's /v1/score body, accepted unchanged: the query joined to each item, as text or
    token ids alike; answered in SGLang's shape."""

    RULES: ClassVar[tuple[Rule, ...]] = (ItemsOfQueryKind(), ItemTokens(), Distinct("label_token_ids", "sglang"))
    items: Text | SglangItems
    label_token_ids: LabelIds
    query: Text | QueryIds | None = None
    apply_softmax: bool | None = False
    item_first: bool | None = False
    model: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=(
        "Echoed in the answer (default 'default'); this gateway serves one model and does not route "
        "on it."))] | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


class GenerateRequest(Struct, forbid_unknown_fields=True):
    """Bounded beam search: the best continuations of a prompt. Give exactly one of prompt or
    input_ids; num_return_sequences must not exceed beam_width (default min(4, the bound))."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        ExactlyOne("prompt", "input_ids"),
        NotAbove("num_return_sequences", "beam_width", field_default=1, limit_default=DEFAULT_BEAM_WIDTH,
                 limit_bound="max_beam_width"))
    prompt: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)] | None = None
    input_ids: PromptIds | None = None
    beam_width: BeamWidth = None
    max_new_tokens: NewTokens = None
    num_return_sequences: BeamWidth = None
    constraints: Annotated[str, limited(Limit("constraints", "one_of", hint=(
        "this deployment has no constraint set; remove the field")))] | None = None
    catalog: Annotated[str, limited(Limit("constraints", "present", hint=(
        "this deployment decodes unconstrained; remove the field")), min_length=1, max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$", description=(
            "The loaded catalogue (e.g. a market) to decode in; default: the one [beam] constraints names; "
            "constrained deployments only."))] | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


STRUCTS: tuple[type[Struct], ...] = (SampleObject, ScoreRequest, SglangScoreRequest, GenerateRequest)
"""Every request Struct above (their `RULES` go into the schema)."""
