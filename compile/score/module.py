"""The prefill-only scoring module: one packed prefill, every head read at each sample's last token.

Exported inputs (T packed tokens, B samples, N = bounds.max_labels label slots):
    input_ids  [T] int64    all samples concatenated
    positions  [T] int64    position of each token inside its own sample
    cu_seqlens [B+1] int32  sample boundaries (0, L0, L0+L1, ...)
    label_ids  [N] int64    label token ids, padded
    label_mask [N] bool     which label slots are real
Outputs, all float32 but the ids: label_logits, label_logprobs, label_probs [B, N], topk_ids [B, K]
int64, topk_logprobs [B, K], hidden [B, H] (after the final norm) and, with an MLP head, head [B, C].
"""

from __future__ import annotations

import torch
from torch import nn

from compile.score.heads import MlpHead, label_heads, topk_head
from compile.model import Transformer

OUTPUT_NAMES = ("label_logits", "label_logprobs", "label_probs", "topk_ids", "topk_logprobs", "hidden")


class ScoreModule(nn.Module):
    """Transformer + scoring heads; the `model` attribute name is shared with the beam node."""

    def __init__(self, model: Transformer, max_top_k: int, mlp_head: MlpHead | None = None):
        super().__init__()
        self.model = model
        self.max_top_k = max_top_k
        self.mlp_head = mlp_head

    def forward(self, input_ids, positions, cu_seqlens, label_ids, label_mask):
        last = self.model.last_hidden(input_ids, positions, cu_seqlens)  # [B, H]
        normed = self.model.norm(last)
        logits = self.model.logits(last)  # [B, V] float32; only B rows ever projected
        logprobs = torch.log_softmax(logits, dim=-1)  # [B, V], shared by the label and top-k heads
        outputs = (*label_heads(logits, logprobs, label_ids, label_mask), *topk_head(logprobs, self.max_top_k),
                   normed.float())
        if self.mlp_head is not None:
            outputs = (*outputs, self.mlp_head(normed))
        return outputs


def pack_inputs(input_ids, sample_lens, label_ids, label_slots: int) -> tuple[torch.Tensor, ...]:
    """The node's inputs from packed ids [T] and lengths [B]: positions restart at 0 in every
    sample, labels are padded to the compiled slots with a mask."""
    cu_seqlens = torch.zeros(len(sample_lens) + 1, dtype=torch.int32)
    torch.cumsum(sample_lens, 0, out=cu_seqlens[1:])
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), sample_lens)
    positions = torch.arange(len(input_ids), dtype=torch.int64) - starts
    labels = torch.zeros(label_slots, dtype=torch.int64)
    labels[: len(label_ids)] = label_ids
    mask = torch.arange(label_slots) < len(label_ids)
    return input_ids.long(), positions, cu_seqlens, labels, mask
