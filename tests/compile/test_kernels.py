"""worker/runtime/kernels: the attention operator, in bfloat16 and float32, against references over scoring-like
key pools (shared prefixes, a static prefix, block padding), its refusals, its library in the artifacts, and
the packages that call it against transformers."""

import shutil

import pytest
import torch

from worker.runtime import kernels
from worker.runtime.artifacts import file_hash, load_kernels, read_manifest
from compile.build import is_up_to_date
from compile.attention import KeyPool, eager_attention, pool_mask
from compile.checkpoint import read_spec
from worker.runtime.layout import CPU_BLOCK
from worker.runtime.machine import ArtifactMismatch
from worker.runtime.loader import load_nodes
from shared.manifest import KernelLibrary
from tests.builds import kernel_checkpoint
from tests.compile.beam_reference import hf_beam
from tests.compile.reference import hf_last_token, load_hf, random_batch
from tests.compile.test_attention import random_pool

bf16_cpu = pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(), reason="the CPU has no AVX512-BF16")
CPU = torch.device("cpu")
LABELS = torch.tensor([0, 5, 17, 300, 1023])


def why_flex_attention(dtype: torch.dtype, head_dim: int) -> str:
    """Why a package of this dtype and head size runs FlexAttention here instead of the C++ kernel."""
    if not torch.cpu._is_avx512_bf16_supported():
        return "the CPU has no AVX512-BF16 (an AVX2 machine, say), which the kernel library is compiled for"
    if head_dim % 16:
        return f"heads {head_dim} wide, not a multiple of 16"
    if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported():
        return "bfloat16 on a CPU with AMX, where FlexAttention's bfloat16 kernel multiplies on the tiles"
    return f"attention_applies({dtype}, cpu, {head_dim}) is false"


def kernel_build(request, fixture: str, dtype: torch.dtype, head_dim: int):
    """The compiled build `fixture` where its packages call the C++ kernel: skipped, naming why, where they would
    run FlexAttention (a test of the kernel must not pass on another kernel); the operator its manifest names is
    recorded as the test's "attention_kernel" property (junit XML) and printed (pytest -rA)."""
    if not kernels.attention_applies(dtype, CPU, head_dim):
        pytest.skip(f"the C++ attention kernel does not apply, FlexAttention would run: {why_flex_attention(dtype, head_dim)}")
    value = request.getfixturevalue(fixture)
    library = read_manifest(value[1] if isinstance(value, tuple) else value).kernels
    assert library is not None, f"attention_applies({dtype}, cpu, {head_dim}) but {fixture} calls no kernel"
    request.node.user_properties.append(("attention_kernel", ", ".join(library.operators)))
    print(f"attention kernel exercised: {', '.join(library.operators)}")
    return value


@pytest.fixture(scope="module")
def operator():
    kernels.build_library()
    return torch.ops.boundserve.packed_attention


def heads_first(*tensors):
    return [t.transpose(0, 1)[None] for t in tensors]


def float64_attention(q, k, v, mask):
    """Attention over the pool in float64 throughout: q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D]; a query
    that sees no key gets zeros."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[0] // k.shape[0], dim=0) for t in (k, v))
    visible = mask.block_mask.mask_mod(0, 0, torch.arange(q.shape[1])[:, None], torch.arange(k.shape[1])[None, :])
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~visible, -float("inf"))
    return (torch._safe_softmax(scores, dim=-1) @ v).transpose(0, 1)


POOL_BLOCKS = pytest.mark.parametrize("block", [CPU_BLOCK, 1], ids=["block32", "unpadded"])
"""Pools as the packages lay them out (counts of whole 32-row blocks), and of any counts: keys that end
inside a 16-key group, a last task whose query vectors do not fill a tile of 4."""


KERNEL_HEADS = pytest.mark.parametrize("heads", [(4, 2, 16), (14, 2, 64), (16, 8, 128), (6, 6, 48)],
                                       ids=lambda h: "x".join(map(str, h)))  # query heads, K/V heads, head size


def pool_inputs(seed: int, heads: tuple[int, int, int], block: int):
    """Random float32 q [Tq, Hq, D], k and v [Tk, Hkv, D] over random_pool(seed, block), and its PoolMask."""
    hq, hkv, d = heads
    cu, parents, cached, num_keys, _ = random_pool(seed, block)
    num_queries = num_keys - cached
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, h, d, generator=g) for n, h in ((num_queries, hq), (num_keys, hkv), (num_keys, hkv)))
    return q, k, v, pool_mask(KeyPool.fitting(num_keys, len(parents), block), cu, parents, num_queries, num_keys)


@bf16_cpu
@KERNEL_HEADS
@pytest.mark.parametrize("seed", range(6))
@POOL_BLOCKS
def test_kernel_matches_the_float32_reference_as_closely_as_bfloat16_does(operator, seed, heads, block):
    """Every query row (samples, shared prefixes over a static prefix, the block padding's own segment)
    against flex_attention's reference in float32; the bound is twice the error of the same reference
    run in bfloat16 (what FlexAttention's bfloat16 kernel computes), so a wrong mask or a lost key, an
    error of order one, cannot pass."""
    q, k, v, mask = pool_inputs(seed, heads, block)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = operator(q, k, v, mask.table)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    reference = eager_attention(*heads_first(q.float(), k.float(), v.float()), mask.block_mask)[0].transpose(0, 1)
    in_bf16 = eager_attention(*heads_first(q, k, v), mask.block_mask)[0].transpose(0, 1)
    bf16_error = (in_bf16.float() - reference).abs().max().item()
    error = (out.float() - reference).abs().max().item()
    assert 0 < bf16_error < 0.05
    assert error <= 2 * bf16_error, (error, bf16_error)


@bf16_cpu
@KERNEL_HEADS
@pytest.mark.parametrize("seed", range(6))
@POOL_BLOCKS
def test_float32_kernel_matches_a_float64_reference(operator, seed, heads, block):
    """The same pools in float32: within 1e-5 of attention computed in float64 throughout, where
    flex_attention's reference in float32 is within 2e-6 (a wrong mask or a lost key is off by a tenth
    or more)."""
    q, k, v, mask = pool_inputs(seed, heads, block)
    out = operator(q, k, v, mask.table)
    assert out.dtype == torch.float32 and out.shape == q.shape
    reference = float64_attention(q, k, v, mask)
    in_float32 = eager_attention(*heads_first(q, k, v), mask.block_mask)[0].transpose(0, 1)
    assert (in_float32.double() - reference).abs().max().item() <= 2e-6
    assert (out.double() - reference).abs().max().item() <= 1e-5


@bf16_cpu
def test_kernel_refuses_what_it_cannot_run(operator):
    cu = torch.tensor([0, 32], dtype=torch.int32)
    table = pool_mask(KeyPool.fitting(32, 1, CPU_BLOCK), cu, torch.tensor([-1]), 32, 32).table
    q, k = torch.randn(32, 4, 32).bfloat16(), torch.randn(32, 2, 32).bfloat16()
    with pytest.raises(RuntimeError, match="all bfloat16 or all float32"):
        operator(q.float(), k, k, table)
    with pytest.raises(RuntimeError, match="all bfloat16 or all float32"):
        operator(q.half(), k.half(), k.half(), table)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        operator(q[..., :24].contiguous(), k[..., :24].contiguous(), k[..., :24].contiguous(), table)
    with pytest.raises(RuntimeError, match="not a multiple of"):
        operator(torch.randn(32, 3, 32).bfloat16(), k, k, table)
    with pytest.raises(RuntimeError, match="intervals for"):
        operator(q, k, k, table[:6 * 16])


def test_bfloat16_artifacts_carry_the_library_their_packages_call(bf16_kernel_artifacts, bf16_artifacts):
    """Where a kernel applies, the build copies its library into the folder and names the operator the
    packages call; elsewhere (here: heads 24 wide) the packages call none and the folder has no library."""
    manifest = load_nodes(bf16_kernel_artifacts).manifest
    library = manifest.kernels
    operator = kernels.attention_kernel(torch.bfloat16, CPU, manifest.model.head_dim)  # on AMX: packed_attention_amx
    if operator is not None:
        assert library is not None and library.operators == (f"boundserve::{operator}",)
        assert file_hash(bf16_kernel_artifacts / library.file) == library.sha256
    else:
        assert library is None and not (bf16_kernel_artifacts / kernels.LIBRARY).exists()
    assert load_nodes(bf16_artifacts).manifest.kernels is None and not (bf16_artifacts / kernels.LIBRARY).exists()


def test_kernel_package_error_is_no_worse_than_transformers_bf16(checkpoint_factory, request):
    """The bound of tests/compile/test_score_node.py's bf16 test (1.5x transformers' own bf16 error + 0.02),
    on a batch with a shared prefix (a segment with a parent) and samples one token long."""
    checkpoint = kernel_checkpoint(checkpoint_factory)
    bf16_kernel_artifacts = kernel_build(request, "bf16_kernel_artifacts", torch.bfloat16, read_spec(checkpoint).head_dim)
    node = load_nodes(bf16_kernel_artifacts).score
    lengths = [64, 7, 33, 1, 20]
    samples = random_batch(node.vocab_size, lengths, 5)
    reference, _ = hf_last_token(load_hf(checkpoint), samples)
    hf_bf16, _ = hf_last_token(load_hf(checkpoint, torch.bfloat16), samples)
    hf_error = (hf_bf16[:, LABELS] - reference[:, LABELS]).abs().max().item()
    out = node(torch.cat(samples), torch.tensor(lengths), LABELS, top_k=5)
    assert (out.label_logits - reference[:, LABELS]).abs().max().item() <= 1.5 * hf_error + 0.02
    prefix, *items = random_batch(node.vocab_size, [30, 9, 33, 1], 6)
    shared = node(torch.cat([prefix, *items]), torch.tensor([len(i) for i in items]), LABELS, top_k=5,
                  prefix_lens=torch.tensor([len(prefix)]), group_sizes=torch.tensor([3]))
    reference, _ = hf_last_token(load_hf(checkpoint), [torch.cat([prefix, i]) for i in items])
    hf_bf16, _ = hf_last_token(load_hf(checkpoint, torch.bfloat16), [torch.cat([prefix, i]) for i in items])
    hf_error = (hf_bf16[:, LABELS] - reference[:, LABELS]).abs().max().item()
    assert (shared.label_logits - reference[:, LABELS]).abs().max().item() <= 1.5 * hf_error + 0.02


def test_kernel_beam_node_finds_beams_as_good_as_transformers_float32(checkpoint_factory, request):
    """The beam node's prompts go through the kernel in its prefill. Which candidates bf16 returns may
    differ from float32's on near ties, so the check is on the best candidate's score: ours (bf16)
    within twice transformers' own bf16 deviation from its float32 best, plus 0.05 nats."""
    checkpoint = kernel_checkpoint(checkpoint_factory)
    bf16_kernel_artifacts = kernel_build(request, "bf16_kernel_artifacts", torch.bfloat16, read_spec(checkpoint).head_dim)
    nodes = load_nodes(bf16_kernel_artifacts)
    eos = nodes.manifest.node_table().beam.eos_ids
    hf32, hf16 = load_hf(checkpoint), load_hf(checkpoint, torch.bfloat16)
    lengths = [9, 1, 30]
    prompts = random_batch(1024, lengths, seed=3)
    ours = nodes.beam(torch.cat(prompts), torch.tensor(lengths), 8, 4, 3)
    for i, prompt in enumerate(prompts):
        best32 = hf_beam(hf32, prompt, 8, 4, 3, eos, 1.0)[1][0].item()
        best16 = hf_beam(hf16, prompt, 8, 4, 3, eos, 1.0)[1][0].item()
        assert abs(ours.scores[i, 0].item() - best32) <= 2 * abs(best16 - best32) + 0.05, (i, best32, best16)


def test_a_folder_missing_its_library_is_rebuilt(bf16_kernel_artifacts, tmp_path):
    """The library counts among the files that make a folder up to date, like the packages and weights."""
    if load_nodes(bf16_kernel_artifacts).manifest.kernels is None:
        pytest.skip("the kernel does not apply on this CPU: the folder has no library")
    folder = shutil.copytree(bf16_kernel_artifacts, tmp_path / "artifacts")
    key = read_manifest(folder).build_key
    assert is_up_to_date(folder, key)
    (folder / kernels.LIBRARY).unlink()
    assert not is_up_to_date(folder, key)


def test_a_library_that_does_not_match_its_hash_is_refused(tmp_path):
    (tmp_path / kernels.LIBRARY).write_bytes(b"not the library the manifest names")
    with pytest.raises(ArtifactMismatch, match="does not match the manifest's hash"):
        load_kernels(tmp_path, KernelLibrary(file=kernels.LIBRARY, sha256="0" * 64))


def test_float32_package_matches_transformers_over_shared_prefixes(request):
    """llama_artifacts (float32, heads 16 wide) call the operator where it applies (skipped, named, elsewhere;
    test_score_node checks the same build on unshared samples); here samples under shared prefixes, whose
    keys sit in parent segments, within test_score_node's float32 tolerance of transformers."""
    checkpoint, folder = kernel_build(request, "llama_artifacts", torch.float32, 16)  # llama: hidden 64, 4 heads
    nodes = load_nodes(folder)
    assert nodes.manifest.model.head_dim == 16
    hf = load_hf(checkpoint)
    groups = [random_batch(nodes.score.vocab_size, lengths, seed) for seed, lengths in enumerate([[30, 9, 33, 1],
                                                                                                 [17, 5, 40]])]
    ids = torch.cat([token for group in groups for token in group])
    out = nodes.score(ids, torch.tensor([len(s) for _, *items in groups for s in items]), LABELS, top_k=5,
                      prefix_lens=torch.tensor([len(prefix) for prefix, *_ in groups]),
                      group_sizes=torch.tensor([len(items) for _, *items in groups]))
    reference, _ = hf_last_token(hf, [torch.cat([prefix, item]) for prefix, *items in groups for item in items])
    assert (out.label_logits - reference[:, LABELS]).abs().max().item() <= 1e-4
