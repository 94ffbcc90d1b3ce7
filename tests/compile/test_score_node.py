"""The compiled scoring package equals transformers at every sample's last token, for every head."""


import pytest
import torch

from worker.runtime.loader import load_nodes
from shared.bounds import BoundsError
from tests.compile.reference import hf_last_token, load_hf, random_batch

LABELS = torch.tensor([0, 5, 17, 300, 1023])
# lengths 1 to the maximum (64), sample counts 1 to the maximum (8), up to 256 tokens per batch
LENGTH_MIXES = [[1], [64], [1, 64], [3, 1, 64, 30, 2, 50, 8, 40], [32] * 8, [17, 5, 64, 64]]


def check_against_transformers(artifacts, checkpoint, dtype=torch.float32, tolerance=1e-4):
    node = load_nodes(artifacts).score
    hf = load_hf(checkpoint, dtype)
    vocab = node.vocab_size
    for seed, lengths in enumerate(LENGTH_MIXES):
        samples = random_batch(vocab, lengths, seed)
        logits, hidden = hf_last_token(hf, samples)
        out = node(torch.cat(samples), torch.tensor(lengths), LABELS, top_k=5)
        logprobs = torch.log_softmax(logits, dim=-1)
        assert (out.label_logits - logits[:, LABELS]).abs().max() <= tolerance
        assert (out.label_logprobs - logprobs[:, LABELS]).abs().max() <= tolerance
        assert torch.allclose(out.label_probs, torch.softmax(logits[:, LABELS], -1), atol=tolerance)
        assert (out.hidden - hidden).abs().max() <= tolerance
        expected_top = torch.topk(logprobs, 5, dim=-1)
        assert torch.equal(out.topk_ids, expected_top.indices), f"lengths {lengths}"
        assert (out.topk_logprobs - expected_top.values).abs().max() <= tolerance
    return node


def test_compiled_qwen3_matches_transformers(demo_artifacts, demo_checkpoint):
    check_against_transformers(demo_artifacts, demo_checkpoint)


@pytest.mark.parametrize("lengths", [[33], [31, 2], [1, 64, 64, 64, 62]])
def test_token_counts_off_the_attention_block_lose_no_sample(demo_artifacts, demo_checkpoint, lengths):
    """FlexAttention silently drops the rows past the last whole block (1,006 tokens gave 896 rows):
    the layout pads the token axis to the block, so every sample, the last one too, is scored."""
    node = load_nodes(demo_artifacts).score
    assert sum(lengths) % node.block, "the batch must end inside a block"
    samples = random_batch(node.vocab_size, lengths, 3)
    logits, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    out = node(torch.cat(samples), torch.tensor(lengths), LABELS, top_k=1)
    assert out.label_logits.shape == (len(lengths), len(LABELS))
    assert (out.label_logits - logits[:, LABELS]).abs().max() <= 1e-4


def test_compiled_llama_matches_transformers(llama_artifacts):
    path, artifacts = llama_artifacts
    check_against_transformers(artifacts, path)


def test_compiled_qwen2_with_mlp_head_matches_transformers(qwen2_with_head):
    path, artifacts, tensors = qwen2_with_head
    node = check_against_transformers(artifacts, path)
    samples = random_batch(node.vocab_size, [5, 9], 7)
    _, hidden = hf_last_token(load_hf(path), samples)
    x = torch.nn.functional.gelu(hidden @ tensors["layers.0.weight"].T + tensors["layers.0.bias"])
    expected = x @ tensors["layers.1.weight"].T + tensors["layers.1.bias"]
    out = node(torch.cat(samples), torch.tensor([5, 9]), LABELS, top_k=1)
    assert out.head.shape == (2, 3)
    assert (out.head - expected).abs().max() <= 1e-4


def test_label_logprobs_are_normalised_over_the_full_vocabulary(demo_artifacts):
    node = load_nodes(demo_artifacts).score
    every_token = torch.arange(node.vocab_size)
    samples = random_batch(node.vocab_size, [4, 11], 1)
    # Ask for the whole vocabulary in slices of the compiled label slots: the probabilities sum to 1.
    total = torch.zeros(2)
    for chunk in every_token.split(8):
        total += node(torch.cat(samples), torch.tensor([4, 11]), chunk, top_k=0).label_logprobs.exp().sum(-1)
    assert torch.allclose(total, torch.ones(2), atol=1e-4)


def test_bf16_package_error_is_no_worse_than_transformers_bf16(demo_checkpoint, bf16_artifacts):
    """Justified bf16 bound as in test_model_parity: within 1.5x transformers' own bf16 error + 0.02."""
    node = load_nodes(bf16_artifacts).score
    samples = random_batch(node.vocab_size, [64, 7, 33, 1, 20], 5)
    reference, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    hf_bf16, _ = hf_last_token(load_hf(demo_checkpoint, torch.bfloat16), samples)
    out = node(torch.cat(samples), torch.tensor([64, 7, 33, 1, 20]), LABELS, top_k=5)
    hf_error = (hf_bf16[:, LABELS] - reference[:, LABELS]).abs().max().item()
    our_error = (out.label_logits - reference[:, LABELS]).abs().max().item()
    assert our_error <= 1.5 * hf_error + 0.02, (our_error, hf_error)


@pytest.mark.parametrize("lengths,labels,top_k,message", [
    ([4] * 9, 2, 1, "the batch holds 9 samples; the compiled bound is 8 samples per batch"),
    ([65], 2, 1, "a sample is 65 tokens long; the compiled bound is 64 tokens per sample"),
    ([64, 64, 64, 64, 1], 2, 1, "the batch holds 257 tokens .a shared prefix once.; the compiled bound is 256 tokens"),
    ([4], 9, 1, "the batch holds 9 label ids; the compiled bound is 8 label ids"),
    ([4], 2, 6, "the batch asks top_k = 6; the compiled bound is 5"),
    ([0, 4], 2, 1, "every sample needs at least one token"),
])
def test_out_of_bounds_batches_are_refused(demo_artifacts, lengths, labels, top_k, message):
    node = load_nodes(demo_artifacts).score
    ids = torch.zeros(sum(lengths), dtype=torch.int64)
    with pytest.raises(BoundsError, match=message):
        node(ids, torch.tensor(lengths), torch.arange(labels), top_k)


def test_token_ids_outside_the_vocabulary_are_refused(demo_artifacts):
    node = load_nodes(demo_artifacts).score
    with pytest.raises(BoundsError, match="token id outside the vocabulary"):
        node(torch.tensor([1, node.vocab_size]), torch.tensor([2]), torch.tensor([1]), 1)
    with pytest.raises(BoundsError, match="label token id outside the vocabulary"):
        node(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([-1]), 1)
    with pytest.raises(BoundsError, match="add up to 3 but 2 token ids"):
        node(torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1]), 1)
