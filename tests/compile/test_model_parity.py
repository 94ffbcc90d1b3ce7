"""The eager packed model equals transformers at every sample's last token, for every family."""

import pytest
import torch

from compile.attention import KeyPool, pool_mask
from worker.runtime.layout import CPU_BLOCK
from compile.checkpoint import load_checkpoint
from compile.linear import onednn_bf16, use_gemm
from compile.model import build_model, last_token_index, rope_rows, rope_table
from worker.runtime.layout import lay_out
from tests.compile.reference import hf_last_token, load_hf, random_batch

# (family, overrides): GQA ratios 1:1, 2:1, 4:1; tied and untied; Qwen3 head_dim != hidden/heads;
# Llama 3 RoPE scaling; Qwen2 q/k/v bias.
VARIANTS = [
    ("qwen3", dict(tie_word_embeddings=False)),
    ("qwen3", dict(tie_word_embeddings=True, num_key_value_heads=1, head_dim=40, rope_theta=1e6)),
    ("qwen2", dict(tie_word_embeddings=True)),
    ("qwen2", dict(tie_word_embeddings=False, num_key_value_heads=4)),
    ("llama", dict(tie_word_embeddings=False, num_key_value_heads=1)),
    ("llama", dict(tie_word_embeddings=True, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
]
LENGTH_MIXES = [[1], [1, 2, 3, 64, 17, 5, 33, 64], [64] * 4, [9, 1]]


def packed_last_logits(model, samples):
    lens = [len(s) for s in samples]
    layout = lay_out(torch.cat(samples), lens, [0] * len(lens), [1] * len(lens), torch.zeros(0, dtype=torch.int64))
    t, cu = len(layout.input_ids), layout.cu_seqlens  # t: padded to the block, a filler segment last
    mask = pool_mask(KeyPool.fitting(t, len(cu) - 1, CPU_BLOCK), cu, layout.parents, t, t)
    with torch.inference_mode():
        hidden = model(layout.input_ids, layout.positions, mask)
        full = model.logits(hidden[last_token_index(cu)[: len(samples)]])
        pruned = model.logits(model.last_hidden(layout.input_ids, layout.positions, mask, cu, layout.parents,
                                                layout.sample_segments)[: len(samples)])
    # the scoring path runs the last layer on last tokens only; it must agree with the full pass
    relative = 1e-4 if full.dtype == torch.float32 and model.embed.weight.dtype == torch.float32 else 2e-2
    assert (full - pruned).abs().max().item() <= relative * max(1.0, full.abs().max().item())
    return pruned


GEMMS = ["aten", pytest.param("onednn", marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                                                   reason="torch built without oneDNN"))]
"""The linears' kernel (compile/linear.py): on oneDNN the SiLU, the SwiGLU product and the residual adds are the
GEMMs' epilogues, on aten pointwise ops after them."""


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("family,overrides", VARIANTS, ids=lambda v: str(v))
def test_eager_model_matches_transformers_fp32(checkpoint_factory, family, overrides, gemm):
    path = checkpoint_factory(family, **overrides)
    checkpoint = load_checkpoint(path)
    model = use_gemm(build_model(checkpoint.spec, checkpoint.state_dict, torch.float32), gemm)
    hf = load_hf(path)
    for seed, lengths in enumerate(LENGTH_MIXES):
        samples = random_batch(checkpoint.spec.vocab_size, lengths, seed)
        expected, _ = hf_last_token(hf, samples)
        got = packed_last_logits(model, samples)
        assert got.shape == expected.shape
        assert (got - expected).abs().max().item() <= 1e-4, f"lengths {lengths}"


@pytest.mark.parametrize("gemm", ["aten", pytest.param("onednn", marks=pytest.mark.skipif(
    not onednn_bf16(), reason="oneDNN has no bfloat16 matmul on this CPU"))])
def test_eager_model_bf16_error_is_no_worse_than_transformers_bf16(checkpoint_factory, gemm):
    """bf16 keeps 8 mantissa bits (relative rounding 2^-9 per op), so bf16 logits drift from fp32 by
    far more than 1e-4. The justified bound: our bf16 error against the fp32 reference is at most
    1.5x transformers' own bf16 error against it, plus 0.02 absolute, on the same inputs."""
    path = checkpoint_factory("qwen3", tie_word_embeddings=False)
    vocab = load_checkpoint(path).spec.vocab_size
    reference, _ = hf_last_token(load_hf(path), random_batch(vocab, [64, 7, 33, 1], 3))
    hf_bf16, _ = hf_last_token(load_hf(path, torch.bfloat16), random_batch(vocab, [64, 7, 33, 1], 3))
    checkpoint = load_checkpoint(path, "bfloat16")
    model = use_gemm(build_model(checkpoint.spec, checkpoint.state_dict, torch.bfloat16), gemm)
    ours = packed_last_logits(model, random_batch(vocab, [64, 7, 33, 1], 3))
    hf_error = (hf_bf16 - reference).abs().max().item()
    our_error = (ours - reference).abs().max().item()
    assert our_error <= 1.5 * hf_error + 0.02, (our_error, hf_error)


@pytest.mark.parametrize("family,overrides", [VARIANTS[1], VARIANTS[5]], ids=("qwen3-theta1e6", "llama3-scaled"))
def test_rope_table_is_transformers_rotary_embedding_at_every_position(checkpoint_factory, family, overrides):
    """The table holds every position the model takes, built once; its rows are transformers' float32
    cos/sin (rotate-half: both halves of D repeat the D/2 frequencies) up to the last position."""
    path = checkpoint_factory(family, **overrides)
    spec = load_checkpoint(path).spec
    table = rope_table(spec)
    assert table.shape == (spec.max_position_embeddings, spec.head_dim) and table.dtype == torch.float32
    positions = torch.tensor([0, 1, 63, 64, 1000, spec.max_position_embeddings - 1])
    x = torch.zeros(1, len(positions), spec.head_dim)
    hf_cos, hf_sin = load_hf(path).model.rotary_emb(x, positions[None])
    half = spec.head_dim // 2
    cos, sin = rope_rows(table, positions, torch.float32)
    for ours, theirs in ((cos, hf_cos[0]), (sin, hf_sin[0])):
        assert torch.equal(theirs[:, :half], theirs[:, half:])
        torch.testing.assert_close(ours, theirs[:, :half], rtol=0, atol=2e-6)
