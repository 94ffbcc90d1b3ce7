"""Shared-prompt attention equals plain softmax attention over the concatenated K/V."""

import pytest
import torch
import torch.nn.functional as F

from compile.beam.attention import prompt_attention, shared_prompt_attention, suffix_attention
from compile.model import merge_partials


def _reference(q, prompt_k, prompt_v, lens, suffix_k, suffix_v, scale):
    """Per request and beam: SDPA over [prompt ; own suffix] with repeated KV heads."""
    r, w, hq, d = q.shape
    g = hq // prompt_k.shape[2]
    out = torch.empty_like(q)
    for i in range(r):
        for j in range(w):
            k = torch.cat((prompt_k[i, : lens[i]], suffix_k[i, j]), 0).repeat_interleave(g, dim=1)  # [N, Hq, D]
            v = torch.cat((prompt_v[i, : lens[i]], suffix_v[i, j]), 0).repeat_interleave(g, dim=1)
            qi = q[i, j][:, None, :]  # [Hq, 1, D]
            out[i, j] = F.scaled_dot_product_attention(qi, k.transpose(0, 1), v.transpose(0, 1), scale=scale)[:, 0]
    return out


@pytest.mark.parametrize("hq,hkv,suffix_len", [(4, 2, 1), (4, 4, 3), (8, 1, 5)])
def test_shared_prompt_attention_equals_concatenated(hq, hkv, suffix_len):
    torch.manual_seed(hq * 10 + suffix_len)
    r, w, d, lens = 3, 5, 16, [7, 2, 11]
    longest = max(lens)
    q = torch.randn(r, w, hq, d)
    pk, pv = torch.randn(r, longest, hkv, d), torch.randn(r, longest, hkv, d)
    valid = torch.arange(longest)[None, :] < torch.tensor(lens)[:, None]
    pk[~valid] = 1e4  # garbage in padding rows must not leak through the mask
    sk, sv = torch.randn(r, w, suffix_len, hkv, d), torch.randn(r, w, suffix_len, hkv, d)
    scale = d ** -0.5
    got = shared_prompt_attention(q, pk, pv, valid, sk, sv, scale)
    want = _reference(q, pk, pv, lens, sk, sv, scale)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_partial_lse_is_the_log_normaliser():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    valid = torch.ones(1, 4, dtype=torch.bool)
    _, lse = prompt_attention(q, k, v, valid, 1.0)
    want = torch.logsumexp(torch.einsum("rwhd,rlhd->rwhl", q, k), dim=-1)
    torch.testing.assert_close(lse, want)
    out_s, lse_s = suffix_attention(q, k[:, None].expand(1, 2, 4, 2, 8), v[:, None].expand(1, 2, 4, 2, 8), 1.0)
    torch.testing.assert_close(lse_s, want)
    # merging a part with itself gives the same output (weights 1/2 + 1/2)
    torch.testing.assert_close(merge_partials(out_s, lse_s, out_s, lse_s), out_s)
