"""Scoring heads: pure tensor functions applied only at each sample's last valid token.

Shapes: B samples, H hidden, V vocabulary, N label slots (padded to a compiled maximum, with a
mask saying which are real), K top-k slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "identity": lambda x: x,
}


def label_heads(logits: torch.Tensor, logprobs: torch.Tensor, label_ids: torch.Tensor, label_mask: torch.Tensor):
    """Label scores from full-vocabulary logits and log-probabilities [B, V] float32.

    Returns raw logits [B, N], log-probabilities under the whole vocabulary [B, N], and the softmax
    over the (unmasked) labels alone [B, N]; masked slots are -inf / -inf / 0.
    """
    label_logits = logits.index_select(1, label_ids)  # [B, N]
    label_logprobs = logprobs.index_select(1, label_ids)
    masked = label_logits.masked_fill(~label_mask[None, :], float("-inf"))
    label_probs = torch.softmax(masked, dim=-1).nan_to_num(0.0)
    return (
        label_logits.masked_fill(~label_mask[None, :], float("-inf")),
        label_logprobs.masked_fill(~label_mask[None, :], float("-inf")),
        label_probs,
    )


def topk_head(logprobs: torch.Tensor, k: int):
    """Top-k tokens from full-vocabulary log-probabilities [B, V]: ids [B, K] int64, values [B, K]."""
    values, ids = torch.topk(logprobs, k, dim=-1)
    return ids, values


def token_heads(logprobs: torch.Tensor, targets: torch.Tensor, k: int):
    """Per-token prompt log-probs from the log-probabilities [P, V] at P token rows: each row's
    target's [P], and its top-k ids [P, K] int64 and values [P, K]."""
    chosen = logprobs.gather(1, targets[:, None])[:, 0]  # [P]
    return (chosen, *topk_head(logprobs, k))


class MlpHead(nn.Module):
    """A small user-supplied classifier on the last-token hidden state: Linear (act Linear)*."""

    def __init__(self, layer_sizes: tuple[int, ...], activation: str):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(layer_sizes[:-1], layer_sizes[1:]))
        self.activation = activation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.float()  # [B, H]; the head runs in float32, it is tiny
        act = ACTIVATIONS[self.activation]
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = act(x)
        return x
