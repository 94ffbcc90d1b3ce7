"""The decode pass of the beam node, built from the model core's layer blocks.

The prompts run once through the model core's `prefill`, which keeps every layer's K/V; `prompt_kv`
lays it out as [R, L, Hkv, D] per request (L = longest prompt, masked), once per request, not per beam.
`decode` runs one new token for each of the R·W beams against the shared prompt K/V and the
beams' own suffix K/V (at most S positions), which it extends and returns.
"""

from __future__ import annotations

import torch

from compile.beam.attention import shared_prompt_attention
from compile.beam.search import take
from compile.model import Transformer, rope_rows



def prompt_kv(packed: list[torch.Tensor], prompt_index: torch.Tensor) -> list[torch.Tensor]:
    """Per layer [T, Hkv, D] -> [R, L, Hkv, D] through prompt_index [R, L] (padding rows point at 0)."""
    r, length = prompt_index.shape
    flat = prompt_index.reshape(-1)
    return [kv.index_select(0, flat).reshape(r, length, kv.shape[1], kv.shape[2]) for kv in packed]


def decode(model: Transformer, tokens, positions, prompt, suffix):
    """One decode step of all beams.

    tokens, positions [R, W] int64; prompt = (keys, values, valid): per layer [R, L, Hkv, D] and
    valid [R, L] bool; suffix = (keys, values): per layer [R, W, J, Hkv, D], or None before step 2.
    Returns logits [R, W, V] float32 and the suffix extended to J + 1 positions.
    """
    r, w = tokens.shape
    prompt_keys, prompt_values, valid = prompt
    x = model.embed(tokens.reshape(-1))  # [N, H], N = R*W
    cos, sin = rope_rows(model.rope_table, positions.reshape(-1), x.dtype)
    scale = model.spec.head_dim ** -0.5
    new_keys, new_values = [], []
    for i, layer in enumerate(model.layers):
        q, k, v = layer.attn.project(layer.input_norm(x), cos, sin)  # [N, Hq, D], [N, Hkv, D]
        sk, sv = k.reshape(r, w, 1, *k.shape[1:]), v.reshape(r, w, 1, *v.shape[1:])  # [R, W, 1, Hkv, D]
        if suffix is not None:
            sk, sv = torch.cat((suffix[0][i], sk), dim=2), torch.cat((suffix[1][i], sv), dim=2)
        attn = shared_prompt_attention(
            q.reshape(r, w, *q.shape[1:]), prompt_keys[i], prompt_values[i], valid, sk, sv, scale,
        )  # [R, W, Hq, D]
        x = layer.attn.output(attn.reshape(r * w, *attn.shape[2:]), x)
        x = layer.mlp.residual(layer.post_attn_norm(x), x)
        new_keys.append(sk)
        new_values.append(sv)
    logits = model.logits(x).reshape(r, w, -1)  # [R, W, V]
    return logits, (new_keys, new_values)


def reorder_suffix(suffix, parent: torch.Tensor):
    """Follow each new beam's parent: per layer [R, Win, J, Hkv, D] -> [R, W, J, Hkv, D]; parent [R, W]."""
    return tuple([take(kv, parent) for kv in side] for side in suffix)
