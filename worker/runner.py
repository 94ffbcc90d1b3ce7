"""Adapts protocol batches to compiled node calls and node outputs back to per-request results.

ScoreRunner packs the live requests of a ScoreBatch into one call of the score node: one group per
request (its shared prefix, possibly empty, then its samples' suffixes), the union of the requests'
label ids, the largest top_k; each request then gets its own rows, its own label columns
(label_probs renormalised over its own labels when the union differs), its own first top_k columns
and the node's count of its tokens that were reused rather than computed (cached_tokens: the static
prefix's and the prefix cache's). A request with prompt_logprobs gets its per-token log-probs too (its
group computed whole: it reads no cached rows) and its first prompt_logprobs top tokens per position.

With a prefix cache (worker/prefix_cache.py), before the call plan_batch picks per request the
longest held prefix of its shared prefix (read by the node as cached rows, not computed) and whether
to keep its prefix's keys/values; the node returns those with the call's outputs (the prefix is
computed once, in the call that scores it) and they are inserted after it. The static template
prefix is not pinned in the cache: the package's own static rows serve it (plan_batch takes a hit
only when it reads more than they give).
BeamRunner does the same for BeamBatch and the beam node.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import torch

from shared.bounds import BoundsError
from shared.protocol import (FLOAT32, INT32, BeamBatch, BeamResult, ErrorCode, ScoreBatch, ScoreResult,
                             Status, unpack_ids)
from shared.request_ids import is_chunk
from shared.work import StaticPrefix
from worker.bounds_check import BatchRefused
from worker.catalog_store import Catalog, CatalogStore, UnknownCatalog
from worker.lanes import Lane
from worker.prefix_cache import GroupPlan, PrefixCache, plan_batch


def _f32(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=FLOAT32).tobytes()


def _i32(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=INT32).tobytes()


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64, for one request's own label columns. [S, n] -> [S, n]"""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


class ScoreRunner:
    """Runs the live requests of a ScoreBatch as one packed call of the score node."""

    def __init__(self, node, cache: PrefixCache | None = None) -> None:
        self.node = node
        self.cache = cache if cache is not None and cache.enabled else None  # startup: off for a package without hits
        self.static = StaticPrefix(tuple(node.static_prefix_ids))

    def run(self, batch: ScoreBatch, live: Sequence[int], lane: Lane) -> dict[int, ScoreResult]:
        requests = [batch.requests[i] for i in live]
        tokens = [unpack_ids(r.input_ids, batch.token_dtype) for r in requests]
        # the shared prefixes as the cache keys them; only with a cache (a per-request copy otherwise wasted)
        prefixes = ([tuple(t[: r.prefix_len].tolist()) for t, r in zip(tokens, requests)]
                    if self.cache is not None else [])
        plans = self._plan(requests, prefixes)
        input_ids = lane.stage_tokens(tokens)  # [T]
        suffix_lens = [n for r in requests for n in r.sample_lens]
        sample_lens = torch.tensor(suffix_lens, dtype=torch.int64)  # [B] each sample's tokens after its prefix
        prefix_lens = torch.tensor([r.prefix_len for r in requests], dtype=torch.int64)  # [R]
        group_sizes = torch.tensor([len(r.sample_lens) for r in requests], dtype=torch.int64)  # [R]
        labels = list(dict.fromkeys(t for r in requests for t in r.label_ids))
        column = {t: j for j, t in enumerate(labels)}
        top_k = max(r.top_k for r in requests)
        try:
            with lane.enqueueing():  # the turn covers the enqueue only; the wait comes after it
                pending = self.node.launch(input_ids, sample_lens, torch.tensor(labels, dtype=torch.int64), top_k,
                                           prefix_lens=prefix_lens, group_sizes=group_sizes, staging=lane.staging,
                                           hits=[None if p.hit is None else (p.hit.keys, p.hit.values) for p in plans],
                                           keep=[g for g, p in enumerate(plans) if p.insert],
                                           token_groups=[g for g, r in enumerate(requests) if r.prompt_logprobs is not None])
        except BoundsError as exc:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, str(exc)) from None
        out = pending.result()
        self._insert(prefixes, out.prefix_kv)
        arrays = {
            "logits": out.label_logits.numpy(), "logprobs": out.label_logprobs.numpy(),  # [B, N]
            "probs": out.label_probs.numpy(), "topk_ids": out.topk_ids.numpy(),  # [B, N], [B, k]
            "topk_logprobs": out.topk_logprobs.numpy(), "hidden": out.hidden.numpy(),  # [B, k], [B, H]
            "head": None if out.head is None else out.head.numpy(),  # [B, C]
        }
        cached = out.cached_tokens.tolist()  # [R]
        results, row = {}, 0
        for group, (index, request) in enumerate(zip(live, requests)):
            rows = slice(row, row + len(request.sample_lens))
            row = rows.stop
            cols = [column[t] for t in request.label_ids]
            results[index] = self._result(request, rows, cols, cols == list(range(len(labels))), arrays,
                                          int(cached[group]))
            if group in out.token_logprobs:
                results[index] = _with_tokens(results[index], out.token_logprobs[group], request.prompt_logprobs)
        return results

    def _plan(self, requests, prefixes: list[tuple[int, ...]]) -> list[GroupPlan]:
        """Per request: the prefix-cache hit its prefix reads and whether its prefix's rows are kept."""
        if self.cache is None:
            return [GroupPlan(None, False)] * len(requests)
        with self.cache.lock:
            plans = plan_batch(self.cache, prefixes, [min(r.sample_lens) > 0 for r in requests],
                               [is_chunk(r.request_id) for r in requests], self.static)
        # per-token log-probs need every token computed: such a request reads no cached rows
        return [GroupPlan(None, p.insert) if r.prompt_logprobs is not None else p for p, r in zip(plans, requests)]

    def _insert(self, prefixes: list[tuple[int, ...]], kept: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Hold the kept prefixes' keys/values [layers, P, Hkv, D] (copied: the outputs are the call's)."""
        if self.cache is None or not kept:
            return
        with self.cache.lock:
            for group, (keys, values) in kept.items():
                self.cache.insert(prefixes[group], keys, values)

    @staticmethod
    def _result(request, rows: slice, cols: list[int], all_labels: bool, a: dict,
                cached_tokens: int) -> ScoreResult:
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
            cached_tokens=cached_tokens,
        )


def _with_tokens(result: ScoreResult, tokens, top_n: int) -> ScoreResult:
    """`result` with a request's per-token log-probs (worker/runtime/score_node.TokenLogprobs: [P], [P, K])
    and their first top_n columns."""
    return msgspec.structs.replace(result, token_logprobs=_f32(tokens.logprobs.numpy()),
                                   token_topk_ids=_i32(tokens.topk_ids[:, :top_n].numpy()),
                                   token_topk_logprobs=_f32(tokens.topk_logprobs[:, :top_n].numpy()))


class BeamRunner:
    """Runs the live requests of a BeamBatch as one call of the beam node; a constrained node's call
    runs on the catalogue current when the batch starts (worker/catalog_store.py), which its results name."""

    def __init__(self, node, catalogs: CatalogStore | None = None) -> None:
        self.node = node
        self.catalogs = catalogs

    def run(self, batch: BeamBatch, live: Sequence[int], lane: Lane) -> dict[int, BeamResult]:
        catalog = self.catalogs.current() if self.catalogs is not None else None  # this batch's, whatever swaps
        refused = self._unknown_catalogs(batch, live, catalog)
        live = [i for i in live if i not in refused]
        if not live:
            return refused
        requests = [batch.requests[i] for i in live]
        prompts = [unpack_ids(r.prompt_ids, batch.token_dtype) for r in requests]
        prompt_ids = lane.stage_tokens(prompts)  # [T]
        prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)  # [R]
        inputs = None if catalog is None else catalog.node_inputs([r.catalog for r in requests])
        try:
            with lane.enqueueing():
                pending = self.node.launch(prompt_ids, prompt_lens, batch.num_beams, batch.max_new_tokens,
                                           batch.num_return_sequences, staging=lane.staging, catalog=inputs)
        except BoundsError as exc:
            raise BatchRefused(ErrorCode.OUT_OF_BOUNDS, str(exc)) from None
        out = pending.result()  # host tensors
        sequences = out.sequences.numpy()  # [R, k, S]
        scores = out.scores.numpy()  # [R, k]
        lengths = out.lengths.numpy()  # [R, k]
        version = 0 if catalog is None else catalog.version
        return refused | {
            index: BeamResult(request_id=r.request_id, status=Status.OK, sequences=_i32(sequences[j]),
                              scores=_f32(scores[j]), lengths=_i32(lengths[j]), catalog_version=version)
            for j, (index, r) in enumerate(zip(live, requests))
        }

    def _unknown_catalogs(self, batch: BeamBatch, live: Sequence[int],
                          catalog: Catalog | None) -> dict[int, BeamResult]:
        """Error results for the requests that name a catalogue this batch cannot decode them in."""
        refused = {}
        for i in live:
            request = batch.requests[i]
            if why := self._catalog_problem(request.catalog, catalog):
                refused[i] = BeamResult(request_id=request.request_id, status=Status.ERROR, error=why)
        return refused

    def _catalog_problem(self, name: str, catalog: Catalog | None) -> str | None:
        if self.catalogs is None:
            return f"catalogue {name!r}: this worker's beam node is unconstrained" if name else None
        if catalog is None:
            return "no catalogue is loaded yet"
        try:
            catalog.root(name)
        except UnknownCatalog as exc:
            return str(exc)
        return None
