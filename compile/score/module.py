"""The prefill-only scoring module: one packed prefill, every head read at each sample's last token.

Exported inputs (T computed tokens, S segments, B samples, N = bounds.max_labels label slots; see
worker/runtime/layout.py for how a batch becomes segments):
    input_ids       [T] int64    the computed tokens of every segment, in segment order
    positions       [T] int64    position of each token in its full sample (after any prefix)
    cu_seqlens      [S+1] int32  segment boundaries over the key pool: the static prefix's cached
                                 rows (when the deployment has one), then the T tokens
    parents         [S] int64    the segment each extends (its keys are read in full), -1 for none
    sample_segments [B] int64    the segment holding each sample's last token
    label_ids       [N] int64    label token ids, padded
    label_mask      [N] bool     which label slots are real
    hit_k, hit_v    [layers, Ch, Hkv, D]  cached prefix rows of earlier requests (the worker's prefix
                                 cache), after the static rows in the pool; at least one block, zero
                                 rows (a segment nobody reads) when the batch has no hit
    keep_rows       [R] int64    key-pool rows to return (at least one block, padded with row 0)
    token_rows      [P] int64    rows of input_ids whose next-token log-probs are returned (per-token
                                 prompt log-probs); P >= 2, two rows of 0 when nobody asks
    token_targets   [P] int64    the token each of those rows predicts (the sample's next token)
Outputs, all float32 but the ids: label_logits, label_logprobs, label_probs [B, N], topk_ids [B, K]
int64, topk_logprobs [B, K], hidden [B, H] (after the final norm), with an MLP head head [B, C], then
token_logprobs [P] (each target's log-prob), token_topk_ids [P, K] int64, token_topk_logprobs [P, K],
then prefix_k, prefix_v [layers, R, Hkv, D]: the keep_rows' keys/values, what the worker's cache inserts.
The token rows cost the last layer and the output projection P more rows: B + 2 rows when nobody asks.
The static prefix's keys/values are buffers (static_k, static_v [layers, C, Hkv, D]) computed once at
build time and stored with the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from compile.attention import KeyPool, pool_mask
from worker.runtime.layout import CPU_BLOCK
from compile.model import Transformer
from compile.score.heads import MlpHead, label_heads, token_heads, topk_head

"""The outputs of a package compiled to take and return prefix-cache rows (after the head, if any)."""


class ScoreModule(nn.Module):
    """Transformer + scoring heads; the `model` attribute name is shared with the beam node."""

    def __init__(self, model: Transformer, max_top_k: int, mlp_head: MlpHead | None = None,
                 static_kv: tuple[torch.Tensor, torch.Tensor] | None = None, pool: KeyPool | None = None):
        super().__init__()
        self.model = model
        self.pool = pool  # the compiled sizes; None (eager use): fitted to each call
        self.max_top_k = max_top_k
        self.mlp_head = mlp_head
        self.has_static = static_kv is not None
        if static_kv is not None:
            self.register_buffer("static_k", static_kv[0])  # [layers, C, Hkv, D]
            self.register_buffer("static_v", static_kv[1])

    def forward(self, input_ids, positions, cu_seqlens, parents, sample_segments, label_ids, label_mask,
                hit_k=None, hit_v=None, keep_rows=None, token_rows=None, token_targets=None):
        """hit_k/hit_v [layers, Layout.hit_rows, Hkv, D]: cached prefix rows of earlier requests, placed
        after the static prefix's (worker/runtime/layout.py: lay_out's hits). keep_rows [R] int64: key-pool
        rows whose keys/values are returned too, as the last two outputs prefix_k, prefix_v
        [layers, R, Hkv, D] (a prefix's rows, for the worker's prefix cache: Layout.rows_of_prefix)."""
        static_kv = cached_rows((self.static_k, self.static_v) if self.has_static else None,
                                None if hit_k is None else (hit_k, hit_v))
        num_tokens = input_ids.shape[0]
        num_keys = num_tokens + (static_kv[0].shape[1] if static_kv is not None else 0)  # cached rows first
        pool = self.pool or KeyPool.fitting(num_keys, parents.shape[0], CPU_BLOCK)
        mask = pool_mask(pool, cu_seqlens, parents, num_tokens, num_keys)  # once, for every layer
        last = self.model.last_hidden(input_ids, positions, mask, cu_seqlens, parents, sample_segments,
                                      static_kv, keep_rows, token_rows)  # [B (+ P), H] (and the kept rows' keys/values)
        kept = ()
        if keep_rows is not None:
            last, *kept = last
        tokens = ()
        if token_rows is not None:
            num_samples = sample_segments.shape[0]
            last, rows = last[:num_samples], last[num_samples:]  # [B, H], [P, H]
            tokens = token_heads(torch.log_softmax(self.model.logits(rows), dim=-1), token_targets, self.max_top_k)
        normed = self.model.norm(last)
        logits = self.model.logits(last)  # [B, V] float32; only B rows ever projected
        logprobs = torch.log_softmax(logits, dim=-1)  # [B, V], shared by the label and top-k heads
        outputs = (*label_heads(logits, logprobs, label_ids, label_mask), *topk_head(logprobs, self.max_top_k),
                   normed.float())
        if self.mlp_head is not None:
            outputs = (*outputs, self.mlp_head(normed))
        return (*outputs, *tokens, *kept)


def cached_rows(static_kv, hit_kv):
    """The key pool's cached rows: the static prefix's, then the hits' ([layers, C, Hkv, D] each), or None."""
    parts = [kv for kv in (static_kv, hit_kv) if kv is not None]
    if len(parts) < 2:
        return parts[0] if parts else None
    return torch.cat([parts[0][0], parts[1][0]], dim=1), torch.cat([parts[0][1], parts[1][1]], dim=1)
