"""Shared-prefix scoring: a batch laid out as prefixes computed once plus suffixes equals transformers
on the full concatenated samples, for every head, in all three families (fp32, within 1e-4)."""

import pytest
import torch

from worker.runtime.loader import load_nodes
from worker.runtime.layout import lay_out
from shared.bounds import BoundsError
from tests.compile.reference import hf_last_token, load_hf
from tests.builds import STATIC_TEMPLATE

LABELS = torch.tensor([0, 5, 17, 300, 1023])
TOLERANCE = 1e-4
# Groups as (prefix length, suffix lengths); prefix 0 = an unshared request (every suffix >= 1).
CASES = {
    "one_token_prefix": [(1, [5, 9, 2])],
    "empty_suffix": [(12, [0, 7, 3])],
    "one_token_suffixes": [(20, [1, 1, 1, 1])],
    "mixed_shared_and_unshared": [(0, [6, 11]), (9, [4, 1, 8]), (0, [3]), (30, [0, 2])],
    "prefix_at_the_bounds": [(64, [0, 0]), (63, [1, 1, 1]), (0, [64]), (0, [62])],  # 64 per sample, 256 per batch
}


def groups_to_call(vocab_size, groups, seed, duplicate=False):
    """(ids, sample_lens, prefix_lens, group_sizes) for the node and the full samples for transformers."""
    generator = torch.Generator().manual_seed(seed)
    ids, lens, full = [], [], []
    for prefix_len, suffix_lens in groups:
        prefix = torch.randint(0, vocab_size, (prefix_len,), generator=generator)
        suffixes = [torch.randint(0, vocab_size, (n,), generator=generator) for n in suffix_lens]
        if duplicate:
            suffixes = [suffixes[0]] * len(suffixes)
        ids += [prefix, *suffixes]
        lens += [len(s) for s in suffixes]
        full += [torch.cat([prefix, s]) for s in suffixes]
    prefix_lens = torch.tensor([p for p, _ in groups])
    sizes = torch.tensor([len(s) for _, s in groups])
    return (torch.cat(ids), torch.tensor(lens), prefix_lens, sizes), full


def assert_equals_transformers(out, hf, full, head_tensors=None):
    logits, hidden = hf_last_token(hf, full)
    logprobs = torch.log_softmax(logits, dim=-1)
    assert (out.label_logits - logits[:, LABELS]).abs().max() <= TOLERANCE
    assert (out.label_logprobs - logprobs[:, LABELS]).abs().max() <= TOLERANCE
    assert (out.label_probs - torch.softmax(logits[:, LABELS], -1)).abs().max() <= TOLERANCE
    assert (out.hidden - hidden).abs().max() <= TOLERANCE
    top = torch.topk(logprobs, 5, dim=-1)
    assert torch.equal(out.topk_ids, top.indices)
    assert (out.topk_logprobs - top.values).abs().max() <= TOLERANCE
    if head_tensors is not None:
        x = torch.nn.functional.gelu(hidden @ head_tensors["layers.0.weight"].T + head_tensors["layers.0.bias"])
        expected = x @ head_tensors["layers.1.weight"].T + head_tensors["layers.1.bias"]
        assert (out.head - expected).abs().max() <= TOLERANCE


def run_cases(node, hf, head_tensors=None):
    for seed, (name, groups) in enumerate(CASES.items()):
        args, full = groups_to_call(node.vocab_size, groups, seed)
        out = node(args[0], args[1], LABELS, 5, args[2], args[3])
        assert_equals_transformers(out, hf, full, head_tensors)
        submitted = sum(len(f) for f in full)
        computed = sum(p for p, _ in groups) + sum(sum(s) for _, s in groups)
        assert out.cached_tokens.sum().item() == submitted - computed, name


def test_qwen3_shared_prefix_equals_transformers(demo_artifacts, demo_checkpoint):
    run_cases(load_nodes(demo_artifacts).score, load_hf(demo_checkpoint))


def test_llama_shared_prefix_equals_transformers(llama_artifacts):
    path, artifacts = llama_artifacts
    run_cases(load_nodes(artifacts).score, load_hf(path))


def test_qwen2_shared_prefix_equals_transformers_with_mlp_head(qwen2_with_head):
    path, artifacts, tensors = qwen2_with_head
    run_cases(load_nodes(artifacts).score, load_hf(path), tensors)


def test_duplicate_samples_share_everything(demo_artifacts, demo_checkpoint):
    node = load_nodes(demo_artifacts).score
    args, full = groups_to_call(node.vocab_size, [(10, [4, 4, 4]), (0, [5, 5])], 3, duplicate=True)
    out = node(args[0], args[1], LABELS, 5, args[2], args[3])
    assert_equals_transformers(out, load_hf(demo_checkpoint), full)
    assert torch.equal(out.label_logits[0], out.label_logits[2])


def test_a_prefix_over_its_bound_is_refused_naming_it(demo_artifacts):
    node = load_nodes(demo_artifacts).score
    ids = torch.zeros(65, dtype=torch.int64)
    with pytest.raises(BoundsError, match="a shared prefix is 65 tokens long.*max_prefix_tokens"):
        node(ids, torch.tensor([0]), LABELS, 1, torch.tensor([65]), torch.tensor([1]))


@pytest.mark.parametrize("prefix_lens,group_sizes,sample_lens,message", [
    ([3], [3], [1, 1], "group_sizes must hold one size >= 1 per prefix and add up to the number of samples"),
    ([0], [2], [0, 2], "every sample needs at least one token"),
    ([40], [2], [25, 1], "a sample is 65 tokens long; the compiled bound is 64 tokens per sample"),
])
def test_inconsistent_groups_are_refused(demo_artifacts, prefix_lens, group_sizes, sample_lens, message):
    node = load_nodes(demo_artifacts).score
    ids = torch.zeros(sum(prefix_lens) + sum(sample_lens), dtype=torch.int64)
    with pytest.raises(BoundsError, match=message):
        node(ids, torch.tensor(sample_lens), LABELS, 1, torch.tensor(prefix_lens), torch.tensor(group_sizes))


# --- the deployment's static prefix: the template header's keys/values come from the package ---


@pytest.fixture(scope="module")
def static_node(static_template_artifacts):
    return load_nodes(static_template_artifacts).score


def test_static_prefix_ids_are_the_template_headers_tokens(static_node, tokenizer):
    static = list(static_node.static_prefix_ids)
    assert len(static) >= 5
    sample = tokenizer.encode(STATIC_TEMPLATE.format(query="likes trail running", text="red shoe")).ids
    assert sample[: len(static)] == static


def test_static_prefix_reuse_equals_transformers(static_node, demo_checkpoint, tokenizer):
    static = torch.tensor(static_node.static_prefix_ids)
    encode = lambda q, t: torch.tensor(tokenizer.encode(STATIC_TEMPLATE.format(query=q, text=t)).ids)  # noqa: E731
    unshared = [encode("hiking", "boots"), encode("coffee", "a mug"), torch.tensor([7, 8, 9]), static.clone()]
    # a group whose common prefix (header + query) starts with the static prefix
    group = [encode("likes trail running", "red shoe"), encode("likes trail running", "blue tent")]
    common = next(i for i, (a, b) in enumerate(zip(*group)) if a != b)
    ids = torch.cat([*unshared, group[0][:common], group[0][common:], group[1][common:]])
    out = static_node(ids, torch.tensor([len(s) for s in unshared] + [len(group[0]) - common, len(group[1]) - common]),
                      LABELS, 5, torch.tensor([0, 0, 0, 0, common]), torch.tensor([1, 1, 1, 1, 2]))
    assert_equals_transformers(out, load_hf(demo_checkpoint), [*unshared, *group])
    # per sample: the two templated ones reuse the header; the raw ids and the bare header do not
    assert out.cached_tokens.tolist() == [len(static), len(static), 0, 0, common + len(static)]


def test_layout_never_reads_the_static_prefix_for_a_sample_that_ends_inside_it():
    static = torch.tensor([5, 6, 7])
    layout = lay_out(torch.tensor([5, 6, 7, 5, 6, 7, 1]), [3, 4], [0, 0], [1, 1], static)
    # static segment, its padding to the block, [5 6 7] in full, [1] over static, the filler
    assert layout.parents.tolist() == [-1, -1, -1, 0, -1]
    assert layout.cached_tokens == [0, 3]
