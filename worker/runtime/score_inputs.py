"""The scoring node's inputs and outputs by name: what the runtime packs for a call and reads back."""

from __future__ import annotations

import torch

from worker.runtime.layout import Layout, lay_out

OUTPUT_NAMES = ("label_logits", "label_logprobs", "label_probs", "topk_ids", "topk_logprobs", "hidden")
PREFIX_KV_OUTPUTS = ("prefix_k", "prefix_v")
TOKEN_OUTPUTS = ("token_logprobs", "token_topk_ids", "token_topk_logprobs")
"""Per-token prompt log-probs, after the per-sample outputs (and the head) and before the prefix rows."""


def unused_token_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """The token_rows and token_targets [2] of a call where nobody asks for per-token log-probs: the
    fewest the package takes (a count of 0 or 1 would have been specialised at export)."""
    zeros = torch.zeros(2, dtype=torch.int64)
    return zeros, zeros.clone()


def token_rows(layout: Layout, input_ids: torch.Tensor, sample_lens: list[int], prefix_lens: list[int],
               group_sizes: list[int], groups: list[int], first_computed_row: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """For every sample of `groups` (whose tokens the layout computed, none reused): the rows of the
    computed tokens [P] at its positions 0 .. L-2 and the tokens they predict (its ids 1 .. L-1) [P],
    in group then sample order; and per group, its count of rows. first_computed_row: the key-pool row
    of the first computed token (the cached rows before it: the static prefix's and the hits', padded).

    A group's prefix rows appear once per sample: each sample's next token after the prefix differs."""
    wanted, rows, targets, counts = set(groups), [], [], []
    cursor, sample = 0, 0
    bounds = layout.cu_seqlens.tolist()
    for group, (prefix_len, size) in enumerate(zip(prefix_lens, group_sizes)):
        lens = sample_lens[sample: sample + size]
        if group in wanted:
            prefix_rows = layout.rows_of_prefix(group) - first_computed_row  # [prefix_len]
            prefix = input_ids[cursor: cursor + prefix_len]
            start, count = cursor + prefix_len, 0
            for b, n in zip(range(sample, sample + size), lens):
                segment = int(layout.sample_segments[b])
                own = torch.arange(bounds[segment], bounds[segment + 1]) - first_computed_row if n else prefix_rows[:0]
                sample_rows = torch.cat([prefix_rows, own])  # [L]
                ids = torch.cat([prefix, input_ids[start: start + n]])  # [L]
                rows.append(sample_rows[:-1])
                targets.append(ids[1:].long())
                count, start = count + len(ids) - 1, start + n
            counts.append(count)
        cursor, sample = cursor + prefix_len + sum(lens), sample + size
    size = max(len(unused_token_rows()[0]), sum(counts))  # fewer than the package takes: padded with row 0
    pad_rows, pad_targets = unused_token_rows()
    return torch.cat([*rows, pad_rows])[:size], torch.cat([*targets, pad_targets])[:size], counts


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
