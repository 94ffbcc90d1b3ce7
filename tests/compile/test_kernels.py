"""compile/kernels: the bfloat16 attention operator against the float32 reference over scoring-like key
pools (shared prefixes, a static prefix, block padding), its refusals, and its library in the artifacts."""

import pytest
import torch

from compile import kernels
from compile.artifacts import load_kernels
from compile.attention import CPU_BLOCK, KeyPool, eager_attention, pool_mask
from compile.machine import ArtifactMismatch
from compile.runtime import load_nodes
from shared.manifest import KernelLibrary
from tests.compile.test_attention import random_pool

bf16_cpu = pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(), reason="the CPU has no AVX512-BF16")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def operator():
    kernels.build_library()
    return torch.ops.boundserve.packed_attention


def heads_first(*tensors):
    return [t.transpose(0, 1)[None] for t in tensors]


@bf16_cpu
@pytest.mark.parametrize("heads", [(4, 2, 16), (14, 2, 64), (16, 8, 128), (6, 6, 48)],
                         ids=lambda h: "x".join(map(str, h)))  # query heads, K/V heads, head size
@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_the_float32_reference_as_closely_as_bfloat16_does(operator, seed, heads):
    """Every query row (samples, shared prefixes over a static prefix, the block padding's own segment)
    against flex_attention's reference in float32; the bound is twice the error of the same reference
    run in bfloat16 (what FlexAttention's bfloat16 kernel computes), so a wrong mask or a lost key, an
    error of order one, cannot pass."""
    hq, hkv, d = heads
    cu, parents, cached, num_keys, _ = random_pool(seed, CPU_BLOCK)
    num_queries = num_keys - cached
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, h, d, generator=g).bfloat16() for n, h in ((num_queries, hq), (num_keys, hkv),
                                                                         (num_keys, hkv)))
    mask = pool_mask(KeyPool.fitting(num_keys, len(parents), CPU_BLOCK), cu, parents, num_queries, num_keys)
    out = operator(q, k, v, mask.table)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    reference = eager_attention(*heads_first(q.float(), k.float(), v.float()), mask.block_mask)[0].transpose(0, 1)
    in_bf16 = eager_attention(*heads_first(q, k, v), mask.block_mask)[0].transpose(0, 1)
    bf16_error = (in_bf16.float() - reference).abs().max().item()
    error = (out.float() - reference).abs().max().item()
    assert 0 < bf16_error < 0.05
    assert error <= 2 * bf16_error, (error, bf16_error)


@bf16_cpu
def test_kernel_refuses_what_it_cannot_run(operator):
    cu = torch.tensor([0, 32], dtype=torch.int32)
    table = pool_mask(KeyPool.fitting(32, 1, CPU_BLOCK), cu, torch.tensor([-1]), 32, 32).table
    q, k = torch.randn(32, 4, 32).bfloat16(), torch.randn(32, 2, 32).bfloat16()
    with pytest.raises(RuntimeError, match="takes bfloat16"):
        operator(q.float(), k.float(), k.float(), table)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        operator(q[..., :24].contiguous(), k[..., :24].contiguous(), k[..., :24].contiguous(), table)
    with pytest.raises(RuntimeError, match="not a multiple of"):
        operator(torch.randn(32, 3, 32).bfloat16(), k, k, table)
    with pytest.raises(RuntimeError, match="intervals for"):
        operator(q, k, k, table[:6 * 16])


def test_bfloat16_artifacts_carry_the_library_their_packages_call(bf16_artifacts):
    """Where the kernel applies, the build copies its library into the folder and names the operator;
    elsewhere the packages call none and the folder has no library."""
    nodes = load_nodes(bf16_artifacts)
    library = nodes.manifest.kernels
    if kernels.attention_applies(torch.bfloat16, CPU, nodes.manifest.model.head_dim):
        assert library is not None and library.operators == ("boundserve::packed_attention",)
        assert kernels.library_hash(bf16_artifacts / library.file) == library.sha256
    else:
        assert library is None and not (bf16_artifacts / kernels.LIBRARY).exists()


def test_a_library_that_does_not_match_its_hash_is_refused(tmp_path):
    (tmp_path / kernels.LIBRARY).write_bytes(b"not the library the manifest names")
    with pytest.raises(ArtifactMismatch, match="does not match the manifest's hash"):
        load_kernels(tmp_path, KernelLibrary(file=kernels.LIBRARY, sha256="0" * 64))
