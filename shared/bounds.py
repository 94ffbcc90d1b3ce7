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
from collections.abc import Mapping
from dataclasses import dataclass

from shared.policy.batching import BatchBounds


class BoundsError(ValueError):
    """A batch falls outside the bounds the node was compiled for; it is refused, never run."""


@dataclass(frozen=True)
class Bounds:
    """What the packages were compiled for (the manifest's "bounds"; shared.config.BoundsConfig)."""

    max_samples_per_batch: int
    max_tokens_per_sample: int
    max_tokens_per_batch: int
    """Tokens sent per batch (each shared prefix once)."""
    max_labels: int
    max_top_k: int
    max_prompt_tokens: int
    max_beam_width: int
    max_new_tokens: int
    max_beam_requests_per_batch: int
    max_prefix_tokens: int
    """Longest shared prefix (resolved: at most max_tokens_per_sample)."""

    @classmethod
    def from_manifest(cls, bounds: Mapping[str, int]) -> Bounds:
        """From the manifest's (or Ready's) bounds dict; an unset max_prefix_tokens (older manifests)
        is max_tokens_per_sample."""
        values = {f.name: int(bounds[f.name]) for f in dataclasses.fields(cls) if f.name != "max_prefix_tokens"}
        per_sample = values["max_tokens_per_sample"]
        values["max_prefix_tokens"] = min(int(bounds.get("max_prefix_tokens") or per_sample), per_sample)
        return cls(**values)


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
    """What the score bounds limit, counted for one request (a group) or one batch."""

    samples: int
    longest_sample: int
    """Tokens of the longest whole sample (its shared prefix + its suffix)."""
    prefix_tokens: int
    """Tokens of the longest shared prefix (0: none)."""
    tokens: int
    """Tokens sent: each shared prefix once, then the suffixes."""
    labels: int
    top_k: int = 0

    @classmethod
    def sample(cls, tokens: int) -> ScoreShape:
        """One whole sample of `tokens` tokens, alone."""
        return cls(1, tokens, 0, tokens, 0)


@dataclass(frozen=True)
class BeamShape:
    """What the beam bounds limit, counted for one batch (or one request: requests = 1)."""

    requests: int
    longest_prompt: int
    num_beams: int
    max_new_tokens: int


def _first(bounds: Bounds, checks: tuple[tuple[str, int], ...]) -> Problem | None:
    for bound, value in checks:
        limit = getattr(bounds, bound)
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


def batch_bounds(bounds: Bounds, workload: str, max_requests: int = 0) -> BatchBounds:
    """What one batch the gateway (or the simulator) packs may hold: score counts samples, tokens
    and distinct labels; beam counts requests and has no token bound (each prompt is checked alone)."""
    if workload == "score":
        return BatchBounds(bounds.max_samples_per_batch, bounds.max_tokens_per_batch, bounds.max_labels, max_requests)
    return BatchBounds(bounds.max_beam_requests_per_batch, None, 0, max_requests)


def batch_capacity(bounds: Bounds, workload: str) -> tuple[int, int | None]:
    """(items, tokens) of one full batch as the latency model counts them (shared/latency_model.py):
    score: samples and tokens; beam: beams over all requests, and no token bound (None)."""
    if workload == "score":
        return bounds.max_samples_per_batch, bounds.max_tokens_per_batch
    return bounds.max_beam_requests_per_batch * bounds.max_beam_width, None
