"""Checks a decoded batch against the compiled bounds before it is queued (pure Python/NumPy).

A request that could never run (too long, a shared prefix over bounds.max_prefix_tokens, bad token
ids) is refused alone and answered `error`; a batch whose totals exceed the bounds is refused whole
with Error(out_of_bounds). A shared prefix counts once, as the node counts it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shared.protocol import BeamBatch, ErrorCode, ScoreBatch, unpack_ids


class BatchRefused(Exception):
    """The whole batch is refused; `code` is a shared.protocol.ErrorCode value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _bad_ids(raw: bytes, token_dtype: str, vocab_size: int) -> bool:
    ids = unpack_ids(raw, token_dtype)
    return bool(len(ids)) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size)


def prefix_bound(bounds: Mapping[str, int]) -> int:
    """bounds.max_prefix_tokens (unset in older manifests: the same as max_tokens_per_sample)."""
    return int(bounds.get("max_prefix_tokens") or bounds["max_tokens_per_sample"])


def _score_request_problem(req, token_dtype: str, b: Mapping[str, int], vocab_size: int) -> str | None:
    longest = req.prefix_len + max(req.sample_lens)  # a whole sample: prefix + suffix
    tokens = req.prefix_len + sum(req.sample_lens)  # the prefix once
    if len(req.sample_lens) > b["max_samples_per_batch"]:
        return f"{len(req.sample_lens)} samples; at most {b['max_samples_per_batch']} fit one batch"
    if longest > b["max_tokens_per_sample"]:
        return f"a sample of {longest} tokens; at most {b['max_tokens_per_sample']}"
    if req.prefix_len > prefix_bound(b):
        return f"a shared prefix of {req.prefix_len} tokens; bounds.max_prefix_tokens = {prefix_bound(b)}"
    if tokens > b["max_tokens_per_batch"]:
        return f"{tokens} tokens (a shared prefix once); at most {b['max_tokens_per_batch']} fit one batch"
    if len(req.label_ids) > b["max_labels"]:
        return f"{len(req.label_ids)} label ids; at most {b['max_labels']}"
    if req.top_k > b["max_top_k"]:
        return f"top_k = {req.top_k}; at most {b['max_top_k']}"
    if req.label_ids and max(req.label_ids) >= vocab_size:
        return f"a label id outside the vocabulary [0, {vocab_size})"
    if _bad_ids(req.input_ids, token_dtype, vocab_size):
        return f"a token id outside the vocabulary [0, {vocab_size})"
    return None


def check_score_batch(batch: ScoreBatch, bounds: Mapping[str, int], vocab_size: int) -> dict[int, str]:
    """Per-request refusals; raises BatchRefused when the accepted requests together exceed bounds.

    A request's tokens are those it sends: its shared prefix once, then its samples' suffixes (the
    node's bound; the static prefix's tokens count, although the node reuses their keys/values)."""
    rejected, tokens, samples, labels = {}, 0, 0, set()
    for i, req in enumerate(batch.requests):
        problem = _score_request_problem(req, batch.token_dtype, bounds, vocab_size)
        if problem:
            rejected[i] = problem
            continue
        tokens, samples = tokens + req.prefix_len + sum(req.sample_lens), samples + len(req.sample_lens)
        labels.update(req.label_ids)
    for what, value, limit in (
        ("samples", samples, "max_samples_per_batch"),
        ("tokens", tokens, "max_tokens_per_batch"),
        ("distinct label ids", len(labels), "max_labels"),
    ):
        if value > bounds[limit]:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, f"batch has {value} {what}; bounds.{limit} = {bounds[limit]}")
    return rejected


def check_beam_batch(batch: BeamBatch, bounds: Mapping[str, int], vocab_size: int) -> dict[int, str]:
    """Per-request refusals; raises BatchRefused when the batch's settings exceed bounds."""
    for what, value, limit in (
        ("num_beams", batch.num_beams, "max_beam_width"),
        ("max_new_tokens", batch.max_new_tokens, "max_new_tokens"),
        ("requests", len(batch.requests), "max_beam_requests_per_batch"),
    ):
        if value > bounds[limit]:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, f"batch {what} = {value}; bounds.{limit} = {bounds[limit]}")
    rejected = {}
    itemsize = np.dtype(batch.token_dtype).itemsize
    for i, req in enumerate(batch.requests):
        tokens = len(req.prompt_ids) // itemsize
        if tokens > bounds["max_prompt_tokens"]:
            rejected[i] = f"a prompt of {tokens} tokens; at most {bounds['max_prompt_tokens']}"
        elif _bad_ids(req.prompt_ids, batch.token_dtype, vocab_size):
            rejected[i] = f"a token id outside the vocabulary [0, {vocab_size})"
    return rejected
