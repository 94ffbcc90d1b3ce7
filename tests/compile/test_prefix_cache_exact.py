"""Cross-request prefix hits are exact: a batch whose prefixes (or their leading parts) are read from
cached keys/values of an earlier computation equals the same batch computed from scratch, for every
head, in all three families (fp32, within 1e-5). Eager modules: the layout and the mask are the
package's; no compile is needed to check the arithmetic."""

import pytest
import torch

from worker.runtime.layout import CPU_BLOCK
from compile.checkpoint import load_checkpoint
from compile.model import build_model
from compile.score.export import static_prefix_kv
from worker.runtime.layout import lay_out
from compile.score.module import ScoreModule
from worker.runtime.score_inputs import pack_hits, pack_inputs

LABELS = torch.tensor([0, 5, 17, 300, 1023])
LABEL_SLOTS = 8
TOLERANCE = 1e-5
STATIC = [11, 12, 13, 14, 15]
# Groups as (prefix, suffix lengths, hit): the prefix's ids ("static+" starts with STATIC), the hit
# its leading tokens held in the cache (0: none).
CASES = {
    "whole_prefix_hit": [(40, [5, 9, 2], 40)],
    "proper_prefix_hit": [(40, [5, 9, 2], 25)],
    "proper_hit_with_an_empty_suffix": [(30, [0, 7, 3], 29)],
    "hit_over_the_static_prefix": [("static+30", [4, 6], 35), ("static+20", [3, 3], 10)],
    "hits_beside_misses": [(0, [6, 11], 0), (33, [4, 1, 8], 33), (12, [2, 2], 0), (50, [1, 1], 17)],
    "one_token_hit": [(9, [3, 4], 1)],
}


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def module(request, checkpoint_factory):
    checkpoint = load_checkpoint(checkpoint_factory(request.param), "float32")
    model = build_model(checkpoint.spec, checkpoint.state_dict, torch.float32)
    static_kv = static_prefix_kv(model, STATIC, "cpu", CPU_BLOCK)
    return ScoreModule(model, 5, None, static_kv).eval()


def prefix_rows(module: ScoreModule, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an earlier request left in the cache: ids' keys/values [layers, P, Hkv, D], computed alone."""
    keys, values = static_prefix_kv(module.model, ids.tolist(), "cpu", CPU_BLOCK)
    return keys[:, : len(ids)], values[:, : len(ids)]


def batch(groups, vocab_size: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids, lens, prefixes = [], [], []
    for prefix, suffix_lens, _ in groups:
        if isinstance(prefix, str):
            rest = torch.randint(0, vocab_size, (int(prefix.split("+")[1]),), generator=generator)
            prefix = torch.cat([torch.tensor(STATIC), rest])
        else:
            prefix = torch.randint(0, vocab_size, (prefix,), generator=generator)
        suffixes = [torch.randint(0, vocab_size, (n,), generator=generator) for n in suffix_lens]
        prefixes.append(prefix)
        ids += [prefix, *suffixes]
        lens += suffix_lens
    return torch.cat(ids), lens, prefixes


@pytest.mark.parametrize("name", list(CASES))
def test_a_hit_equals_the_answer_from_scratch(module, name):
    groups = CASES[name]
    ids, lens, prefixes = batch(groups, module.model.spec.vocab_size, seed=len(name))
    prefix_lens, sizes = [len(p) for p in prefixes], [len(s) for _, s, _ in groups]
    hits = [hit for _, _, hit in groups]
    static = torch.tensor(STATIC)
    with torch.no_grad():
        scratch_layout = lay_out(ids, lens, prefix_lens, sizes, static)
        scratch = module(*pack_inputs(ids, None, LABELS, LABEL_SLOTS, scratch_layout))
        layout = lay_out(ids, lens, prefix_lens, sizes, static, hits=hits)
        rows = pack_hits([prefix_rows(module, p[:hit]) for p, hit in zip(prefixes, hits) if hit], layout.hit_rows)
        cached = module(*pack_inputs(ids, None, LABELS, LABEL_SLOTS, layout), *rows)
    for got, want in zip(cached, scratch):
        if want.dtype == torch.int64:
            assert torch.equal(got, want)
        else:
            same = got == want  # the padded label slots are -inf on both sides
            assert torch.where(same, 0.0, (got - want).abs()).max() <= TOLERANCE
    assert sum(layout.cached_tokens) > sum(scratch_layout.cached_tokens)  # the hits were not computed
    for group, (prefix, suffix_lens, hit) in enumerate(groups):
        if hit:
            submitted = len(prefixes[group]) * len(suffix_lens) + sum(suffix_lens)
            computed = len(prefixes[group]) - hit + sum(suffix_lens)
            assert layout.cached_tokens[group] == submitted - computed


def test_a_hit_must_leave_the_last_token_to_compute():
    ids = torch.arange(10)
    with pytest.raises(ValueError, match="must leave every sample's last token to compute"):
        lay_out(ids, [0, 2], [8], [2], torch.tensor(STATIC), hits=[8])
