"""The scoring node's inputs and outputs by name: what the runtime packs for a call and reads back."""

from __future__ import annotations

import torch

from worker.runtime.layout import Layout, lay_out

OUTPUT_NAMES = ("label_logits", "label_logprobs", "label_probs", "topk_ids", "topk_logprobs", "hidden")
PREFIX_KV_OUTPUTS = ("prefix_k", "prefix_v")


def pack_hits(hits: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hits' keys/values ([layers, P_r, Hkv, D] each, in group order) as the node's hit_k, hit_v:
    concatenated and padded with zero rows (a segment nobody reads) to `rows` (Layout.hit_rows)."""
    keys = torch.cat([k for k, _ in hits], dim=1)
    values = torch.cat([v for _, v in hits], dim=1)
    pad = rows - keys.shape[1]
    rows_last = (0, 0, 0, 0, 0, pad)  # [layers, P, Hkv, D]: zero rows appended along P
    return torch.nn.functional.pad(keys, rows_last), torch.nn.functional.pad(values, rows_last)


def pack_inputs(input_ids, sample_lens, label_ids, label_slots: int, layout: Layout | None = None) -> tuple[torch.Tensor, ...]:
    """The node's inputs: the batch's segment layout (default: every sample its own segment, no
    prefix, no static prefix) and the labels padded to the compiled slots with a mask."""
    if layout is None:
        lens = [int(n) for n in sample_lens]
        layout = lay_out(input_ids, lens, [0] * len(lens), [1] * len(lens), input_ids.new_zeros(0))
    labels = torch.zeros(label_slots, dtype=torch.int64)
    labels[: len(label_ids)] = label_ids
    mask = torch.arange(label_slots) < len(label_ids)
    return layout.input_ids, layout.positions, layout.cu_seqlens, layout.parents, layout.sample_segments, labels, mask
