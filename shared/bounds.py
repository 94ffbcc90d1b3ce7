"""The compiled bounds, declared once: `Bounds`, one pure check per workload, and the rules' words.

Every boundary runs the same check and answers a broken rule its own way: the gateway after
tokenizing (413 too_large, the field named), the worker on receipt (one request answered `error`,
or the whole batch refused out_of_bounds) and the node before running (BoundsError). A check
returns the first `Problem` (which bound, the value, the limit); its words come from one table here.
Token-id checks that need the arrays stay where the arrays are, worded by `outside_vocabulary`.
Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from msgspec import Meta


@dataclass(frozen=True)
class BatchBounds:
    """What one packed batch may hold (from the manifest's bounds)."""

    max_items_per_batch: int
    """score: samples per batch; beam: requests per batch."""
    max_tokens_per_batch: int | None
    """Tokens sent per batch; None = no token bound (beam batches: each prompt is bounded alone)."""
    max_labels: int
    max_jobs_per_batch: int = 0
    """Jobs per batch besides the bounds; 0 = no limit (1 turns batching off: the simulator's G/G/1)."""



class BoundsError(ValueError):
    """A batch falls outside the bounds the node was compiled for; it is refused, never run."""


class InvalidBounds(ValueError):
    """Bounds whose fields contradict each other (the config loader says it as a ConfigError)."""


Positive = Annotated[int, Meta(ge=1)]


@dataclass(frozen=True)
class Bounds:
    """The deployment's limits, declared once: the config's [bounds] section, compiled into the
    packages, recorded in the manifest, carried by Ready and enforced by gateway, worker and node.

    Each field declares its type and range (msgspec checks them when the config, the manifest or a
    Ready is decoded); `validate` holds the rules across fields. `limit(name)` is a bound's value
    with an unset max_prefix_tokens resolved."""

    max_samples_per_batch: Annotated[int, Meta(ge=2)] = 16
    """Scoring: samples (sequences) in one packed batch."""
    max_tokens_per_sample: Positive = 512
    """Scoring: tokens in one sample."""
    max_tokens_per_batch: Positive = 4096
    """Scoring: tokens sent in one packed batch, all samples together (each shared prefix once)."""
    max_labels: Positive = 32
    """Scoring: label token ids per batch."""
    max_top_k: Positive = 20
    """Scoring: largest top_k a request may ask for."""
    max_prompt_tokens: Positive = 512
    """Beam search: tokens in one prompt."""
    max_beam_width: Annotated[int, Meta(ge=1, le=400)] = 400
    """Beam search: beams per request (W)."""
    max_new_tokens: Annotated[int, Meta(ge=1, le=5)] = 4
    """Beam search: decode steps per request (S), at most 5."""
    max_beam_requests_per_batch: Positive = 4
    """Beam search: requests (prompts) in one batch."""
    max_prefix_tokens: Positive | None = None
    """Scoring: tokens of a request's shared prefix, computed once for all its samples (unset = the
    same as max_tokens_per_sample; older manifests leave it out). A longer common prefix is computed
    unshared, never cut."""

    def limit(self, name: str) -> int:
        """The bound `name` (a field) as an int: an unset max_prefix_tokens is max_tokens_per_sample."""
        if name == "max_prefix_tokens":
            return min(self.max_prefix_tokens or self.max_tokens_per_sample, self.max_tokens_per_sample)
        return getattr(self, name)

    def resolved(self) -> Bounds:
        """The same bounds with every field set (what the build records in the manifest)."""
        return dataclasses.replace(self, max_prefix_tokens=self.limit("max_prefix_tokens"))

    def validate(self) -> None:
        """Raise InvalidBounds naming the first rule across fields these bounds break."""
        if self.max_prefix_tokens is not None and self.max_prefix_tokens > self.max_tokens_per_sample:
            raise InvalidBounds(f"bounds.max_prefix_tokens = {self.max_prefix_tokens} must be between 1 and "
                                f"bounds.max_tokens_per_sample ({self.max_tokens_per_sample})")
        if self.max_tokens_per_sample > self.max_tokens_per_batch:
            raise InvalidBounds(
                "bounds.max_tokens_per_sample must not exceed bounds.max_tokens_per_batch "
                f"({self.max_tokens_per_sample} > {self.max_tokens_per_batch})"
            )


# bound -> (the rule's words, what breaks it: None for the whole batch or request, else the part's
# default name). {subject} is what broke it, {value} what it holds, {limit} the bound.
_RULES = {
    "max_samples_per_batch": ("{subject} holds {value} samples; the compiled bound is {limit} samples per batch",
                              None),
    "max_tokens_per_sample": ("{subject} is {value} tokens long; the compiled bound is {limit} tokens per sample",
                              "a sample"),
    "max_prefix_tokens": ("{subject} is {value} tokens long; the compiled bound is {limit} tokens per shared "
                          "prefix", "a shared prefix"),
    "max_tokens_per_batch": ("{subject} holds {value} tokens (a shared prefix once); the compiled bound is "
                             "{limit} tokens per batch", None),
    "max_labels": ("{subject} holds {value} label ids; the compiled bound is {limit} label ids", None),
    "max_top_k": ("{subject} asks top_k = {value}; the compiled bound is {limit}", None),
    "max_prompt_tokens": ("{subject} is {value} tokens long; the compiled bound is {limit} prompt tokens",
                          "a prompt"),
    "max_beam_width": ("{subject} asks num_beams = {value}; the compiled bound is {limit} beams", None),
    "max_new_tokens": ("{subject} asks max_new_tokens = {value}; the compiled bound is {limit} decode steps", None),
    "max_beam_requests_per_batch": ("{subject} holds {value} requests; the compiled bound is {limit} requests "
                                    "per batch", None),
}


def rule_words(bound: str, value: int | str, limit: int | str, whole: str = "the batch",
               part: str | None = None) -> str:
    """The words of `bound`'s rule: about `whole` (the batch or request) or, for a rule on one part,
    `part` (default: the rule's own, e.g. "a sample"; the gateway names the field, e.g. "sample 3").
    `value` and `limit` may be placeholders (the gateway's decoder fills in "{count}" and "{bound}")."""
    words, part_name = _RULES[bound]
    subject = whole if part_name is None else part or part_name
    return words.format(subject=subject, value=value, limit=limit)


@dataclass(frozen=True)
class Problem:
    """One bound broken: `bound` names the Bounds field, `value` is what was asked, `limit` the bound."""

    bound: str
    value: int
    limit: int

    def message(self, whole: str = "the batch", part: str | None = None, name_bound: bool = True) -> str:
        """The rule's words (rule_words), naming the deployment's setting unless `name_bound` is False
        (the gateway's users see their field instead)."""
        text = rule_words(self.bound, self.value, self.limit, whole, part)
        return f"{text} (bounds.{self.bound})" if name_bound else text

    def __str__(self) -> str:
        return self.message()


def outside_vocabulary(noun: str, vocab_size: int) -> str:
    """The words for a `noun` ("token id", "label token id") outside [0, vocab_size)."""
    return f"a {noun} outside the vocabulary [0, {vocab_size})"


@dataclass(frozen=True)
class ScoreShape:
    """What the score bounds limit, counted for one request (a group) or one batch; shared/work.py's
    WorkSize.shape and batch_shape make it."""

    samples: int
    longest_sample: int
    """Tokens of the longest whole sample (its shared prefix + its suffix)."""
    prefix_tokens: int
    """Tokens of the longest shared prefix (0: none)."""
    tokens: int
    """Tokens sent: each shared prefix once, then the suffixes."""
    labels: int
    top_k: int = 0


@dataclass(frozen=True)
class BeamShape:
    """What the beam bounds limit, counted for one batch (or one request: requests = 1)."""

    requests: int
    longest_prompt: int
    num_beams: int
    max_new_tokens: int


def _first(bounds: Bounds, checks: tuple[tuple[str, int], ...]) -> Problem | None:
    for bound, value in checks:
        limit = bounds.limit(bound)
        if value > limit:
            return Problem(bound, value, limit)
    return None


def score_problem(bounds: Bounds, shape: ScoreShape) -> Problem | None:
    """The first score bound `shape` breaks, else None (a long shared prefix is named before the
    samples it makes too long)."""
    return _first(bounds, (
        ("max_samples_per_batch", shape.samples), ("max_prefix_tokens", shape.prefix_tokens),
        ("max_tokens_per_sample", shape.longest_sample), ("max_tokens_per_batch", shape.tokens),
        ("max_labels", shape.labels), ("max_top_k", shape.top_k),
    ))


def beam_problem(bounds: Bounds, shape: BeamShape) -> Problem | None:
    """The first beam bound `shape` breaks, else None."""
    return _first(bounds, (
        ("max_beam_width", shape.num_beams), ("max_new_tokens", shape.max_new_tokens),
        ("max_beam_requests_per_batch", shape.requests), ("max_prompt_tokens", shape.longest_prompt),
    ))


def batch_bounds(bounds: Bounds, workload: str, max_jobs_per_batch: int = 0) -> BatchBounds:
    """What one batch the gateway (or the simulator) packs may hold: score counts samples, tokens
    and distinct labels; beam counts requests and has no token bound (each prompt is checked alone)."""
    if workload == "score":
        return BatchBounds(bounds.max_samples_per_batch, bounds.max_tokens_per_batch, bounds.max_labels, max_jobs_per_batch)
    return BatchBounds(bounds.max_beam_requests_per_batch, None, 0, max_jobs_per_batch)


class BatchCapacity(NamedTuple):
    """One full batch as the latency model counts it (shared/latency_model.py)."""

    max_items_per_batch: int
    """score: samples; beam: beams over all requests."""
    max_tokens_per_batch: int | None
    """score: tokens; beam: None (no token bound)."""


def batch_capacity(bounds: Bounds, workload: str) -> BatchCapacity:
    """One full batch of `workload` under `bounds`, as the latency model counts it."""
    if workload == "score":
        return BatchCapacity(bounds.max_samples_per_batch, bounds.max_tokens_per_batch)
    return BatchCapacity(bounds.max_beam_requests_per_batch * bounds.max_beam_width, None)
