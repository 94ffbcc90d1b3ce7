"""POST /v1/completions (OpenAI's legacy schema), declared once: the request body, its rules across
fields, the answer, and the parser into a CompletionSpec.

What it serves, all without sampling (temperature 0 or absent):
- prompt scoring: `echo: true, logprobs: N, max_tokens: 0` -> the prompt's tokens, each one's
  log-prob given the tokens before it (null for the first) and the N most likely tokens there, as
  lm-evaluation-harness's local-completions reads them;
- one greedy token: `max_tokens: 1` (with or without echo) -> the most likely next token (the n most
  likely with n > 1), from the scoring node's last-token top-k;
- `max_tokens > 1` -> bounded beam search (gateway/generation.py): best_of beams (default n), the n
  best returned, within the compiled max_beam_width and max_new_tokens.
Parameters it cannot honour (sampling, streaming, stop sequences, penalties, logit_bias, suffix) are
refused by name, never ignored: each is a Rule (gateway/api/rules.py) stated in /openapi.json too.
"""

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct

from gateway.api.decoding import BodyDecoder
from gateway.api.limit import limited
from gateway.api.rules import Rule
from gateway.api.types import MAX_MODEL_CHARS, DeadlineMs, Priority, Text, TokenId, compiled, per_request
from gateway.errors import ApiError
from gateway.limits import Limits

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for max_tokens."""


@dataclass(frozen=True)
class Unsupported:
    """A parameter this gateway cannot honour, refused unless absent or at its neutral value."""

    field: str
    neutral: tuple[Any, ...]
    why: str

    @property
    def name(self) -> str:
        return f"unsupported:{self.field}"

    @property
    def says(self) -> str:
        allowed = ", ".join(["absent", "null", *map(_json, self.neutral)])
        return f"{self.field} is one of: {allowed} ({self.why})"

    def broken(self, body: Any, where: str) -> str | None:
        value = getattr(body, self.field)
        if value is None or value in self.neutral:
            return None
        return f"{where}.{self.field} = {_json(value)} is not supported: {self.why}"

    def schema(self) -> dict[str, Any]:
        return {"properties": {self.field: {"enum": [None, *self.neutral]}}}


@dataclass(frozen=True)
class Greedy:
    """Generated tokens are chosen without sampling: temperature 0 (or absent) and top_p 1 (or absent)."""

    name: str = "greedy:temperature,top_p,max_tokens"
    says: str = ("when max_tokens is not 0, temperature is absent, null or 0 and top_p absent, null or 1: "
                 "tokens are chosen greedily (max_tokens 1) or by beam search, never sampled")

    def broken(self, body: Any, where: str) -> str | None:
        if body.max_tokens == 0:
            return None  # nothing is generated: temperature and top_p change nothing
        if body.temperature:
            return (f"{where}.temperature = {body.temperature}: this gateway does not sample; send temperature 0 "
                    "(greedy for max_tokens 1, beam search above) or max_tokens 0 to score the prompt")
        if body.top_p is not None and body.top_p != 1:
            return f"{where}.top_p = {body.top_p}: this gateway does not sample; send top_p 1 or leave it out"
        return None

    def schema(self) -> dict[str, Any]:
        sampled = {"properties": {"temperature": {"enum": [None, 0]}, "top_p": {"enum": [None, 1]}}}
        return {"if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}}, "else": sampled}


@dataclass(frozen=True)
class FewerReturnedThanTried:
    """n <= best_of: best_of candidates are tried and the n best returned."""

    name: str = "not_above:n,best_of"
    says: str = "n (default 1) at most best_of (default n)"

    def broken(self, body: Any, where: str) -> str | None:
        n = body.n or 1
        if body.best_of is None or n <= body.best_of:
            return None
        return f"{where}.n = {n} must not exceed {where}.best_of = {body.best_of}"

    def schema(self) -> None:
        return None


@dataclass(frozen=True)
class OneScoredPrompt:
    """With max_tokens 0 nothing is generated, so there is one answer per prompt: n and best_of 1."""

    name: str = "one_answer:n,best_of,max_tokens"
    says: str = "with max_tokens 0, n and best_of are absent, null or 1 (a scored prompt has one answer)"

    def broken(self, body: Any, where: str) -> str | None:
        if body.max_tokens != 0 or max(body.n or 1, body.best_of or 1) == 1:
            return None
        return (f"{where}.n = {body.n}, best_of = {body.best_of} with max_tokens 0: a prompt scored without "
                "generating has one answer; send n 1")

    def schema(self) -> dict[str, Any]:
        one = {"enum": [None, 1]}
        return {"if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
                "then": {"properties": {"n": one, "best_of": one}}}


@dataclass(frozen=True)
class OneKindOfPrompt:
    """A prompt is a string, or a list of strings, of token ids or of token-id lists: never a mix."""

    name: str = "one_kind:prompt"
    says: str = "prompt is a string, a list of strings, a list of token ids or a list of token-id lists"

    def broken(self, body: Any, where: str) -> str | None:
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        if len({type(p) for p in prompts}) < 2:
            return None
        return (f"{where}.prompt mixes strings, token ids and lists of token ids; send a string, a list of "
                "strings, a list of token ids or a list of token-id lists")

    def schema(self) -> dict[str, Any]:
        lists = [{"type": "array", "items": {"type": kind}} for kind in ("string", "integer", "array")]
        return {"properties": {"prompt": {"anyOf": [{"type": "string"}, *lists]}}}


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


TokenIds = Annotated[list[TokenId], Meta(min_length=1)]
Prompts = Annotated[per_request("prompt holds {count} prompts; this deployment takes at most {bound} per request",
                                Text | TokenId | TokenIds),
                    Meta(description="A string, a list of strings, a list of token ids, or a list of token-id lists.")]
TopLogprobs = Annotated[int, limited(compiled("max_top_k", "logprobs = {value} is over the compiled bound of {bound} "
                                                           "top tokens", "le"),
                                     ge=0, description="Top tokens per position (the chosen one is added).")]


class CompletionRequest(Struct, forbid_unknown_fields=True):
    """OpenAI's legacy completions: prompt scoring (echo + logprobs + max_tokens 0), one greedy token
    (max_tokens 1) or bounded beam search (max_tokens > 1, n of best_of beams). Never sampled."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        OneKindOfPrompt(), Greedy(), FewerReturnedThanTried(), OneScoredPrompt(),
        Unsupported("stream", (False,), "answers come whole; send stream false or leave it out"),
        Unsupported("stream_options", (), "answers are not streamed"),
        Unsupported("stop", ("", []), "stop sequences are not applied; leave stop out"),
        Unsupported("suffix", ("",), "insertion after a suffix is not served"),
        Unsupported("logit_bias", ({},), "logits are not biased here"),
        Unsupported("presence_penalty", (0, 0.0), "penalties are not applied"),
        Unsupported("frequency_penalty", (0, 0.0), "penalties are not applied"))
    prompt: Text | Prompts
    model: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=(
        "The served model's name (GET /v1/models), or absent; another is refused."))] | None = None
    echo: bool | None = False
    logprobs: TopLogprobs | None = None
    max_tokens: Annotated[int, Meta(ge=0, description=(
        f"Tokens to generate (default {DEFAULT_MAX_TOKENS}); 0 scores the prompt only."))] | None = None
    n: Annotated[int, Meta(ge=1)] | None = None
    best_of: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    seed: int | None = None
    user: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description="Logged nowhere; accepted for "
                                                                      "compatibility.")] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    stop: Text | list[Text] | None = None
    suffix: Text | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


@dataclass(frozen=True)
class CompletionSpec:
    """A validated /v1/completions request, before tokenization."""

    prompts: list[str | list[int]]
    """Per prompt: its text (tokenized as given, no template) or its token ids."""
    echo: bool
    logprobs: int | None
    """Top tokens per position; None: no logprobs in the answer."""
    max_tokens: int
    n: int
    best_of: int
    model: str | None
    """The model asked for (None: the served one); another is refused (404) when the request runs."""
    deadline_ms: int | None
    priority: int | None = None
    """The body's priority (None: not given)."""


def parse_completions(raw: bytes, limits: Limits) -> CompletionSpec:
    """Decode a /v1/completions body; raises ApiError (400/404/413) naming the field."""
    if not limits.score_enabled and not limits.beam_enabled:
        raise ApiError("not_found", "this deployment serves neither scoring nor beam search, which /v1/completions "
                                    "runs on")
    spec = DECODER.decode(raw, limits)
    _check_served(spec, limits)
    return spec


def _spec(body: Any, limits: Limits) -> CompletionSpec:
    prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
    if isinstance(prompts[0], int):
        prompts = [prompts]  # one prompt given as token ids (OneKindOfPrompt: all are)
    n = body.n or 1
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    return CompletionSpec(prompts, bool(body.echo), body.logprobs, max_tokens, n, body.best_of or n,
                          body.model, body.deadline_ms, body.priority)


DECODER = BodyDecoder(CompletionRequest, _spec)


def _check_served(spec: CompletionSpec, limits: Limits) -> None:
    """What the compiled nodes can answer: scoring for max_tokens 0 and 1, beam search above; 404
    naming the missing node, 413 naming the bound."""
    bounds = limits.bounds
    if spec.max_tokens <= 1 and not limits.score_enabled:
        raise ApiError("not_found", f"max_tokens = {spec.max_tokens} runs on the scoring node, which this deployment "
                                    "does not serve (score.enabled is false)")
    if spec.max_tokens == 1 and spec.best_of > bounds.max_top_k:
        raise ApiError("too_large", f"best_of = {spec.best_of} (n = {spec.n}) with max_tokens 1 takes the best first "
                                    f"tokens of the last position, over the compiled bound of {bounds.max_top_k} "
                                    "(bounds.max_top_k)")
    if spec.max_tokens <= 1:
        return
    if not limits.beam_enabled:
        raise ApiError("not_found", f"max_tokens = {spec.max_tokens} needs beam search, which this deployment does "
                                    "not serve (beam.enabled is false); send max_tokens 0 or 1")
    if spec.logprobs is not None or spec.echo:
        raise ApiError("invalid_request", "echo and logprobs with max_tokens > 1 are not served (beam search returns "
                                          "whole continuations); send max_tokens 0 or 1 for log-probs")
    for name, value, bound in (("max_tokens", spec.max_tokens, "max_new_tokens"),
                               ("best_of", spec.best_of, "max_beam_width")):
        if value > limits.limit(bound):
            raise ApiError("too_large", f"{name} = {value} is over the compiled bound of {limits.limit(bound)} "
                                        f"(bounds.{bound}); nothing was truncated")


class Logprobs(Struct):
    """Per token of the choice's text: the token, its log-prob (null for a prompt's first), the most
    likely tokens there (with the chosen one), its character offset in `text`."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    text: str
    index: int
    logprobs: Logprobs | None
    finish_reason: Literal["stop", "length"]


class CompletionUsage(Struct):
    """As OpenAI counts: every prompt's tokens, every generated token of every choice."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionAnswer(Struct, kw_only=True):
    """The answer to /v1/completions: choices in prompt order, n per prompt."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
