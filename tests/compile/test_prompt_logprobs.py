"""Per-token prompt log-probs of the scoring node equal transformers' log_softmax at every position,
in batches that mix them with plain scoring, shared prefixes and the static prefix; the plain
requests of such a batch get what they get without them."""

import pytest
import torch

from shared.bounds import BoundsError
from tests.compile.reference import load_hf, random_batch
from worker.runtime.loader import load_nodes

LABELS = torch.tensor([0, 5, 17])


def hf_prompt_logprobs(hf, ids: torch.Tensor) -> torch.Tensor:
    """log_softmax [L - 1, V] (float32) at positions 0 .. L-2 of one sample, by transformers."""
    with torch.inference_mode():
        return torch.log_softmax(hf(ids[None]).logits[0, :-1].float(), dim=-1)


def check_sample(hf, ids: torch.Tensor, part, rows: slice, k: int, tolerance: float = 1e-4) -> None:
    expected = hf_prompt_logprobs(hf, ids)  # [L-1, V]
    got_lp, got_ids, got_values = part.logprobs[rows], part.topk_ids[rows, :k], part.topk_logprobs[rows, :k]
    chosen = expected.gather(1, ids[1:, None])[:, 0]
    assert (got_lp - chosen).abs().max() <= tolerance
    top = torch.topk(expected, k, dim=-1)
    assert torch.equal(got_ids, top.indices)
    assert (got_values - top.values).abs().max() <= tolerance


@pytest.mark.parametrize("lengths", [[2], [9, 1, 33], [64, 40, 7, 2]])
def test_per_token_logprobs_match_transformers(demo_artifacts, demo_checkpoint, lengths):
    node = load_nodes(demo_artifacts).score
    hf = load_hf(demo_checkpoint)
    samples = random_batch(node.vocab_size, lengths, seed=len(lengths))
    asked = [i for i, n in enumerate(lengths) if i % 2 == 0]  # every other sample asks; one-token samples give none
    out = node(torch.cat(samples), torch.tensor(lengths), LABELS, top_k=5, token_groups=asked)
    plain = node(torch.cat(samples), torch.tensor(lengths), LABELS, top_k=5)
    assert sorted(out.token_logprobs) == asked
    for group in asked:
        part = out.token_logprobs[group]
        assert part.logprobs.shape == (lengths[group] - 1,)
        check_sample(hf, samples[group], part, slice(None), 5)
    assert torch.equal(out.topk_ids, plain.topk_ids)  # the last-token outputs are untouched
    assert (out.label_logprobs - plain.label_logprobs).abs().max() <= 1e-5
    assert plain.token_logprobs == {}


def test_shared_prefix_groups_give_every_sample_its_positions(demo_artifacts, demo_checkpoint):
    """A group of a shared prefix and three suffixes (one empty): the prefix's rows serve each sample,
    each predicting that sample's own next token."""
    node = load_nodes(demo_artifacts).score
    hf = load_hf(demo_checkpoint)
    prefix, *suffixes = random_batch(node.vocab_size, [20, 5, 0, 11], seed=4)
    ids = torch.cat([prefix, *suffixes])
    out = node(ids, torch.tensor([5, 0, 11]), LABELS, top_k=3, prefix_lens=torch.tensor([20]),
               group_sizes=torch.tensor([3]), token_groups=[0])
    part, start = out.token_logprobs[0], 0
    for suffix in suffixes:
        sample = torch.cat([prefix, suffix])
        check_sample(hf, sample, part, slice(start, start + len(sample) - 1), 3)
        start += len(sample) - 1
    assert start == len(part.logprobs)


def test_static_prefix_tokens_are_computed_for_the_groups_that_ask(static_template_artifacts, demo_checkpoint):
    """A sample that starts with the deployment's static prefix reuses its rows, except when it asks for
    per-token log-probs: then every one of its positions is computed and returned."""
    node = load_nodes(static_template_artifacts).score
    hf = load_hf(demo_checkpoint)
    static = torch.tensor(node.static_prefix_ids)
    tail = random_batch(node.vocab_size, [6], seed=5)[0]
    sample = torch.cat([static, tail])
    out = node(torch.cat([sample, sample]), torch.tensor([len(sample)] * 2), LABELS, top_k=2, token_groups=[1])
    assert out.cached_tokens.tolist() == [len(static), 0]
    check_sample(hf, sample, out.token_logprobs[1], slice(None), 2)


def test_more_positions_than_a_batch_holds_are_refused(demo_artifacts):
    node = load_nodes(demo_artifacts).score
    prefix, *suffixes = random_batch(node.vocab_size, [60, 4, 4, 4, 4, 4, 4], seed=6)
    with pytest.raises(BoundsError, match="max_tokens_per_batch"):
        node(torch.cat([prefix, *suffixes]), torch.tensor([4] * 6), LABELS, top_k=1, prefix_lens=torch.tensor([60]),
             group_sizes=torch.tensor([6]), token_groups=[0])
