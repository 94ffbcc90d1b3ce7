"""worker/runtime/kernels' AMX operator (torch.ops.boundserve.packed_attention_amx): exact against FlexAttention's reference on
every mask the nodes use (causal packed samples, shared prefixes and a static prefix as a tree of parents, the block
padding's own segment, a beam prompt), on both models' head shapes, its refusals, and which operator a bfloat16
package calls. Every test here runs packed_attention_amx and says so in its name; on a CPU without AMX they skip,
naming why."""

import pytest
import torch

from worker.runtime import kernels
from compile.attention import KeyPool, eager_attention, pool_mask
from worker.runtime.layout import CPU_BLOCK, padded
from worker.runtime.layout import lay_out
from tests.compile.test_kernels import POOL_BLOCKS, heads_first, pool_inputs

CPU = torch.device("cpu")
AMX = "packed_attention_amx"
needs_amx = pytest.mark.skipif(kernels.attention_kernel(torch.bfloat16, CPU, 64) != AMX,
                               reason="packed_attention_amx not selected: the CPU lacks AMX (amx_tile, amx_bf16) or "
                                      "AVX512-BF16, or Linux refused this process the AMX tile state")
AMX_HEADS = pytest.mark.parametrize("heads", [(14, 2, 64), (16, 8, 128), (4, 2, 32), (6, 6, 96), (8, 1, 64)],
                                    ids=lambda h: "x".join(map(str, h)))
"""Query heads, K/V heads, head size: Qwen2.5-0.5B (GQA 7:1), Qwen3-0.6B (2:1), narrow heads, no grouping with a head
three tiles wide, GQA 8:1 (a task's 32 vectors are 4 rows)."""


@pytest.fixture(scope="module")
def amx_operator():
    kernels.build_library()
    return torch.ops.boundserve.packed_attention_amx


def bf16_bounds(q, k, v, mask):
    """(reference, bound): flex_attention's reference in float32, and twice the error of the same reference run in
    bfloat16 (what FlexAttention's bfloat16 kernel computes): a wrong mask or a lost key, an error of order one,
    cannot pass."""
    reference = eager_attention(*heads_first(q.float(), k.float(), v.float()), mask.block_mask)[0].transpose(0, 1)
    in_bf16 = eager_attention(*heads_first(q, k, v), mask.block_mask)[0].transpose(0, 1)
    bf16_error = (in_bf16.float() - reference).abs().max().item()
    assert 0 < bf16_error < 0.05
    return reference, 2 * bf16_error


@needs_amx
@AMX_HEADS
@pytest.mark.parametrize("seed", range(6))
@POOL_BLOCKS
def test_packed_attention_amx_matches_the_float32_reference_over_prefix_trees(amx_operator, seed, heads, block):
    """Scoring-like pools (tests/compile/test_attention.random_pool): samples under shared prefixes (parents), over a
    static prefix (grandparents), the block padding's own segment; whole 32-row blocks and any counts (a last task
    of fewer than 32 vectors, keys ending inside a 32-key tile)."""
    q, k, v, mask = pool_inputs(seed, heads, block)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = amx_operator(q, k, v, mask.table)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    reference, bound = bf16_bounds(q, k, v, mask)
    error = (out.float() - reference).abs().max().item()
    assert error <= bound, (error, bound)


@needs_amx
@pytest.mark.parametrize("heads", [(14, 2, 64), (16, 8, 128)], ids=["qwen2.5", "qwen3"])
def test_packed_attention_amx_matches_the_reference_on_causal_packed_samples(amx_operator, heads):
    """The scoring node's pool of unshared samples (worker/runtime/layout.lay_out: causal per sample, padded to the
    block by a filler segment), samples of 1 to 300 tokens, on both models' heads."""
    lengths = [300, 1, 45, 17, 129, 64, 2]
    layout = lay_out(torch.zeros(sum(lengths), dtype=torch.int64), lengths, prefix_lens=[0] * len(lengths),
                     group_sizes=[1] * len(lengths), static_ids=torch.zeros(0, dtype=torch.int64))
    cu_seqlens, parents, rows = layout.cu_seqlens, layout.parents, int(layout.cu_seqlens[-1])
    assert rows == padded(sum(lengths), CPU_BLOCK) and len(parents) == len(lengths) + 1  # + the padding's segment
    mask = pool_mask(KeyPool.fitting(rows, len(parents), CPU_BLOCK), cu_seqlens, parents, rows, rows)
    generator = torch.Generator().manual_seed(1)
    hq, hkv, d = heads
    q, k, v = (torch.randn(rows, h, d, generator=generator).bfloat16() for h in (hq, hkv, hkv))
    out = amx_operator(q, k, v, mask.table)
    reference, bound = bf16_bounds(q, k, v, mask)
    assert (out.float() - reference).abs().max().item() <= bound
    # the same call with the samples' masks forgotten (every query sees the whole pool) is far off
    wrong = eager_attention(*heads_first(q.float(), k.float(), v.float()),
                            pool_mask(KeyPool.fitting(rows, 1, CPU_BLOCK), torch.tensor([0, rows], dtype=torch.int32),
                                      torch.tensor([-1]), rows, rows).block_mask)[0].transpose(0, 1)
    assert (wrong - reference).abs().max().item() > 10 * bound


@needs_amx
def test_packed_attention_amx_matches_the_reference_on_a_beam_prompt(amx_operator):
    """The beam node's prefill: one prompt, then its block padding as a segment of its own (Qwen3 heads)."""
    length = 77
    rows = padded(length, CPU_BLOCK)
    mask = pool_mask(KeyPool.fitting(rows, 2, CPU_BLOCK), torch.tensor([0, length], dtype=torch.int32),
                     torch.tensor([-1]), rows, rows)
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(rows, h, 128, generator=generator).bfloat16() for h in (16, 8, 8))
    reference, bound = bf16_bounds(q, k, v, mask)
    assert (amx_operator(q, k, v, mask.table).float() - reference).abs().max().item() <= bound


@needs_amx
def test_packed_attention_amx_agrees_with_the_avx512_operator(amx_operator):
    """The same arithmetic as packed_attention in bfloat16 (float32 scores and softmax, probabilities rounded to
    bfloat16): the two differ only in the order the tiles sum products, which moves an output by less than two units
    in the last place of bfloat16 at its vector's largest element (measured: under one), on both models' heads."""
    for heads in (14, 2, 64), (16, 8, 128):
        q, k, v, mask = pool_inputs(3, heads, CPU_BLOCK)
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        amx = amx_operator(q, k, v, mask.table).float()
        avx512 = torch.ops.boundserve.packed_attention(q, k, v, mask.table).float()
        ulp = torch.maximum(amx.abs(), avx512.abs()).amax(-1, keepdim=True) * 2.0 ** -7  # 8 significant bits
        assert ((amx - avx512).abs() <= 2 * ulp).all()
        assert (amx - avx512).abs().max() > 0  # the two kernels ran: their sums differ somewhere


@needs_amx
def test_packed_attention_amx_refuses_what_it_cannot_run(amx_operator):
    cu = torch.tensor([0, 32], dtype=torch.int32)
    table = pool_mask(KeyPool.fitting(32, 1, CPU_BLOCK), cu, torch.tensor([-1]), 32, 32).table
    q, k = torch.randn(32, 4, 64).bfloat16(), torch.randn(32, 2, 64).bfloat16()
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        amx_operator(q.float(), k.float(), k.float(), table)
    with pytest.raises(RuntimeError, match="all bfloat16 or all float32"):
        amx_operator(q, k.float(), k, table)
    with pytest.raises(RuntimeError, match="a multiple of 32"):
        amx_operator(q[..., :48].contiguous(), k[..., :48].contiguous(), k[..., :48].contiguous(), table)
    with pytest.raises(RuntimeError, match="not a multiple of"):
        amx_operator(torch.randn(32, 3, 64).bfloat16(), k, k, table)
    with pytest.raises(RuntimeError, match="intervals for"):
        amx_operator(q, k, k, table[:6 * 16])


def test_a_bfloat16_package_calls_the_amx_operator_where_the_cpu_has_amx():
    """Which operator compile/attention.packed_attention traces (attention_kernel), by the CPU's features: the AMX one
    for bfloat16 heads a multiple of 32 wide where the CPU has AMX, else the paths of before (AVX512-BF16 or float32
    FMAs: packed_attention; heads of 48 on AMX: FlexAttention's bfloat16 kernel)."""
    if not torch.cpu._is_avx512_bf16_supported():
        assert kernels.attention_kernel(torch.bfloat16, CPU, 64) is None
        return
    amx = torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx()
    assert kernels.attention_kernel(torch.float32, CPU, 64) == "packed_attention"
    assert kernels.attention_kernel(torch.bfloat16, CPU, 64) == (AMX if amx else "packed_attention")
    assert kernels.attention_kernel(torch.bfloat16, CPU, 128) == (AMX if amx else "packed_attention")
    assert kernels.attention_kernel(torch.bfloat16, CPU, 48) == (None if amx else "packed_attention")
    assert kernels.attention_kernel(torch.float16, CPU, 64) is None
    assert kernels.attention_kernel(torch.bfloat16, CPU, 24) is None
