"""Adapts protocol batches to compiled node calls and node outputs back to per-request results.

ScoreRunner packs the live requests of a ScoreBatch into one call of the score node: all samples
concatenated, the union of the requests' label ids, the largest top_k; each request then gets its
own rows, its own label columns (label_probs renormalised over its own labels when the union
differs) and its own first top_k columns. BeamRunner does the same for BeamBatch and the beam node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from shared.bounds import BoundsError
from shared.protocol import (FLOAT32, INT32, BeamBatch, BeamResult, ErrorCode, ScoreBatch, ScoreResult,
                             Status, unpack_ids)
from worker.bounds_check import BatchRefused
from worker.lanes import Lane


def _f32(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=FLOAT32).tobytes()


def _i32(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=INT32).tobytes()


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64, for one request's own label columns. [S, n] -> [S, n]"""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def _whole_samples(request, token_dtype: str) -> np.ndarray:
    """The request's samples, each whole (prefix + suffix), concatenated. Interim: the compiled node
    does not take shared prefixes yet, so a shared prefix is computed once per sample."""
    ids = unpack_ids(request.input_ids, token_dtype)  # [prefix_len + sum(suffixes)]
    if not request.prefix_len:
        return ids
    prefix, ends = ids[: request.prefix_len], np.cumsum((request.prefix_len, *request.sample_lens))
    return np.concatenate([part for start, end in zip(ends[:-1], ends[1:]) for part in (prefix, ids[start:end])])


class ScoreRunner:
    """Runs the live requests of a ScoreBatch as one packed call of the score node."""

    def __init__(self, node) -> None:
        self.node = node

    def run(self, batch: ScoreBatch, live: Sequence[int], lane: Lane) -> dict[int, ScoreResult]:
        requests = [batch.requests[i] for i in live]
        input_ids = lane.stage_tokens([_whole_samples(r, batch.token_dtype) for r in requests])  # [T]
        whole_lens = [r.prefix_len + n for r in requests for n in r.sample_lens]
        sample_lens = torch.tensor(whole_lens, dtype=torch.int64)  # [B]
        labels = list(dict.fromkeys(t for r in requests for t in r.label_ids))
        column = {t: j for j, t in enumerate(labels)}
        top_k = max(r.top_k for r in requests)
        try:
            with lane.running():
                out = self.node(input_ids, sample_lens, torch.tensor(labels, dtype=torch.int64), top_k)
        except BoundsError as exc:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, str(exc)) from None
        arrays = {
            "logits": out.label_logits.numpy(), "logprobs": out.label_logprobs.numpy(),  # [B, N]
            "probs": out.label_probs.numpy(), "topk_ids": out.topk_ids.numpy(),  # [B, N], [B, k]
            "topk_logprobs": out.topk_logprobs.numpy(), "hidden": out.hidden.numpy(),  # [B, k], [B, H]
            "head": None if out.head is None else out.head.numpy(),  # [B, C]
        }
        results, row = {}, 0
        for index, request in zip(live, requests):
            rows = slice(row, row + len(request.sample_lens))
            row = rows.stop
            cols = [column[t] for t in request.label_ids]
            results[index] = self._result(request, rows, cols, cols == list(range(len(labels))), arrays)
        return results

    @staticmethod
    def _result(request, rows: slice, cols: list[int], all_labels: bool, a: dict) -> ScoreResult:
        logits = a["logits"][rows][:, cols]  # [S, n]
        if not cols:
            probs = logits  # [S, 0]
        else:
            probs = a["probs"][rows] if all_labels else _softmax(logits)
        k = request.top_k
        return ScoreResult(
            request_id=request.request_id,
            status=Status.OK,
            num_samples=rows.stop - rows.start,
            label_logits=_f32(logits),
            label_logprobs=_f32(a["logprobs"][rows][:, cols]),
            label_probs=_f32(probs),
            topk_ids=_i32(a["topk_ids"][rows, :k]),
            topk_logprobs=_f32(a["topk_logprobs"][rows, :k]),
            hidden=_f32(a["hidden"][rows]) if request.return_hidden else b"",
            head=b"" if a["head"] is None else _f32(a["head"][rows]),
        )


class BeamRunner:
    """Runs the live requests of a BeamBatch as one call of the beam node."""

    def __init__(self, node) -> None:
        self.node = node

    def run(self, batch: BeamBatch, live: Sequence[int], lane: Lane) -> dict[int, BeamResult]:
        requests = [batch.requests[i] for i in live]
        prompts = [unpack_ids(r.prompt_ids, batch.token_dtype) for r in requests]
        prompt_ids = lane.stage_tokens(prompts)  # [T]
        prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)  # [R]
        try:
            with lane.running():
                out = self.node(prompt_ids, prompt_lens, batch.num_beams, batch.max_new_tokens,
                                batch.num_return_sequences)
        except BoundsError as exc:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, str(exc)) from None
        sequences = out.sequences.cpu().numpy()  # [R, k, S]
        scores = out.scores.cpu().numpy()  # [R, k]
        lengths = out.lengths.cpu().numpy()  # [R, k]
        return {
            index: BeamResult(request_id=r.request_id, status=Status.OK, sequences=_i32(sequences[j]),
                              scores=_f32(scores[j]), lengths=_i32(lengths[j]))
            for j, (index, r) in enumerate(zip(live, requests))
        }
