"""bench/attention_op.py's parts: the pool is laid out as the scoring node lays out a call, every side computes the same
attention as float64 from the same inputs, and the parity check refuses an operator that is off."""

from __future__ import annotations

import pytest
import torch

from bench.attention_op import float64_attention, head_shapes, parity, pool_layout, sides
from bench.harness.common import MODELS, QWEN3_06B
from worker.runtime.layout import CPU_BLOCK
from worker.runtime.kernels import attention_kernel

LENGTHS = [5, 40, 17]  # 62 tokens: the pool is padded to 64, the padding a segment of its own


def test_head_shapes_read_the_models_layer_shapes():
    assert head_shapes(MODELS["qwen2.5-0.5b"][1]) == (14, 2, 64)
    assert head_shapes(QWEN3_06B) == (16, 8, 128)


def test_the_pool_is_the_samples_then_one_padding_segment():
    cu_seqlens, parents, rows = pool_layout(LENGTHS)
    assert rows == 2 * CPU_BLOCK
    assert cu_seqlens.tolist() == [0, 5, 45, 62, 64] and parents.tolist() == [-1] * 4
    whole_blocks = pool_layout([CPU_BLOCK, CPU_BLOCK])[0].tolist()
    assert whole_blocks == [0, CPU_BLOCK, 2 * CPU_BLOCK]  # no padding, no extra segment


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_side_is_causal_attention_per_sample(dtype):
    operator = attention_kernel(dtype, torch.device("cpu"), 32)
    if operator is None:
        pytest.skip(f"no operator of worker/runtime/kernels runs {dtype} on this CPU")
    cu_seqlens, parents, rows = pool_layout(LENGTHS)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, heads, 32, generator=generator).to(dtype) for heads in (4, 2, 2))
    fns = sides(q, k, v, LENGTHS, cu_seqlens, parents, rows, flex=False)
    tokens = sum(LENGTHS)
    reference = float64_attention(q, k, v, LENGTHS)[:tokens]
    outputs = {name: fn()[:tokens] for name, fn in fns.items()}
    checks, errors = parity(outputs, reference, dtype)
    # on AMX in bfloat16, the AVX512-BF16 operator beside the AMX one
    beside = {"ours_avx512"} if operator == "packed_attention_amx" else set()
    assert set(errors) == {"ours", "sdpa"} | beside and all(c["ok"] for c in checks) and len(checks) == 1 + len(beside)
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    assert max(errors.values()) < tolerance
    # a sample that saw its neighbour's keys: attention over the whole pool, unmasked
    wrong = float64_attention(q[:tokens], k[:tokens], v[:tokens], [tokens])
    assert float((wrong - reference).abs().max()) > 0.1
    assert not parity({**outputs, "ours": wrong.to(dtype)}, reference, dtype)[0][0]["ok"]
