"""Checks a decoded batch against the compiled bounds before it is queued (pure Python/NumPy).

The rules are shared/bounds.py's, the same the gateway and the node apply. A request that could
never run (too long, a shared prefix over bounds.max_prefix_tokens, bad token ids) is refused alone
and answered `error`; a batch whose totals exceed the bounds is refused whole with
Error(out_of_bounds). A shared prefix counts once, as the node counts it.
"""

from __future__ import annotations

import numpy as np

from shared.bounds import BeamShape, Bounds, Problem, beam_problem, outside_vocabulary, score_problem
from shared.protocol import BeamBatch, ErrorCode, ScoreBatch, ScoreRequest, unpack_ids
from shared.work import batch_shape


class BatchRefused(Exception):
    """The whole batch is refused; `code` is a shared.protocol.ErrorCode value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _refuse(problem: Problem | None) -> None:
    if problem:
        raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, problem.message())


def _bad_ids(raw: bytes, token_dtype: str, vocab_size: int) -> bool:
    ids = unpack_ids(raw, token_dtype)
    return bool(len(ids)) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size)


def _score_request_problem(req: ScoreRequest, token_dtype: str, bounds: Bounds, vocab_size: int) -> str | None:
    problem = score_problem(bounds, req.work().shape(len(req.label_ids), req.top_k))
    if problem:
        return problem.message("the request")
    if req.prompt_logprobs is not None and req.prompt_logprobs > bounds.max_top_k:
        return (f"prompt_logprobs {req.prompt_logprobs} is more than the {bounds.max_top_k} top tokens per position "
                "the deployment is compiled for (bounds.max_top_k)")
    if req.label_ids and max(req.label_ids) >= vocab_size:
        return outside_vocabulary("label token id", vocab_size)
    if len(set(req.label_ids)) != len(req.label_ids):
        return "a label token id is given twice: it would share its probability with itself"
    if _bad_ids(req.input_ids, token_dtype, vocab_size):
        return outside_vocabulary("token id", vocab_size)
    return None


def check_score_batch(batch: ScoreBatch, bounds: Bounds, vocab_size: int) -> dict[int, str]:
    """Per-request refusals; raises BatchRefused when the accepted requests together exceed bounds.

    A request's tokens are those it sends: its shared prefix once, then its samples' suffixes (the
    node's bound; the static prefix's tokens count, although the node reuses their keys/values)."""
    rejected, accepted, labels = {}, [], set()
    for i, req in enumerate(batch.requests):
        problem = _score_request_problem(req, batch.token_dtype, bounds, vocab_size)
        if problem:
            rejected[i] = problem
            continue
        accepted.append(req.work())
        labels.update(req.label_ids)
    _refuse(score_problem(bounds, batch_shape(accepted, len(labels))))
    return rejected


def check_beam_batch(batch: BeamBatch, bounds: Bounds, vocab_size: int) -> dict[int, str]:
    """Per-request refusals; raises BatchRefused when the batch's settings exceed bounds."""
    _refuse(beam_problem(bounds, BeamShape(len(batch.requests), 0, batch.num_beams, batch.max_new_tokens)))
    rejected = {}
    itemsize = np.dtype(batch.token_dtype).itemsize
    for i, req in enumerate(batch.requests):
        problem = beam_problem(bounds, BeamShape(1, len(req.prompt_ids) // itemsize, 1, 1))
        if problem:
            rejected[i] = problem.message("the request")
        elif _bad_ids(req.prompt_ids, batch.token_dtype, vocab_size):
            rejected[i] = outside_vocabulary("token id", vocab_size)
    return rejected
