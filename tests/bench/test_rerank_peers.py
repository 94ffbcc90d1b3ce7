"""bench/rerank.py's CTranslate2 at its best: its shared-prefix path (the query as a cached static prompt, one
document per batch) scores each document's last token as transformers does, and the compute type timed is the
fastest that passes the run's bound. Real CTranslate2 on a tiny checkpoint; skipped, named, without the bench extra."""

import pytest
import torch

from bench import rerank
from bench.harness import ct2_baseline, peer_settings
from tests.compile.reference import hf_last_token, load_hf, random_batch

pytest.importorskip("ctranslate2", reason="the bench extra (ctranslate2) is not installed")

LABELS = torch.tensor([5, 9])  # two ids of the tiny vocabulary standing for "yes" and "no"


@pytest.fixture
def ct2(demo_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(ct2_baseline, "CACHE", tmp_path)  # the converted model: this test's own
    return ct2_baseline.Ct2Model(demo_checkpoint, threads=1)


def request() -> tuple[torch.Tensor, list[torch.Tensor]]:
    prefix, *suffixes = random_batch(1024, [12, 5, 30, 17, 1], 3)
    return prefix, suffixes


def test_a_static_prompt_and_each_document_score_the_last_token_as_transformers_does(ct2, demo_checkpoint):
    prefix, suffixes = request()
    reference, _ = hf_last_token(load_hf(demo_checkpoint), [torch.cat([prefix, s]) for s in suffixes])
    shared = ct2.last_logits("float32", ct2.strings(suffixes), ct2.strings([prefix])[0])
    whole = ct2.last_logits("float32", ct2.strings([torch.cat([prefix, s]) for s in suffixes]))
    for scores in (shared, whole):
        assert scores.shape == reference.shape
        assert (torch.log_softmax(scores, -1) - torch.log_softmax(reference, -1)).abs().max() <= 1e-3


def test_the_compute_type_timed_is_the_fastest_within_the_runs_bound(ct2, demo_checkpoint):
    prefix, suffixes = request()
    reference, _ = hf_last_token(load_hf(demo_checkpoint), [torch.cat([prefix, s]) for s in suffixes])
    check = rerank.margin_check("fp32", reference[:, LABELS], reference[:, LABELS], LABELS)
    chosen, table, refused = peer_settings.ct2_compute_type(ct2, ("int8", "float32"), ct2.strings(suffixes),
                                                            ct2.strings([prefix])[0], check)
    assert set(table) == {"int8", "float32"}
    assert chosen == "float32" and list(refused) == ["int8"]  # int8 misses float32's bound of 1e-3 nats
    assert refused["int8"]["max_abs_diff"] > refused["int8"]["tolerance"] == 1e-3


def test_in_bf16_a_peers_yes_minus_no_is_held_to_transformers_own_bf16_error_from_either_shape():
    reference = torch.tensor([[1.0, 0.0], [0.5, 0.2]])  # float32's yes/no logits
    hf_bf16 = reference + torch.tensor([[0.1, 0.0], [0.0, 0.0]])  # its margin 0.1 off: the bound is 1.5 x 0.1 + 0.02
    check = rerank.margin_check("bf16", reference, hf_bf16)
    within, beyond = reference + torch.tensor([[0.16, 0.0], [0.0, 0.0]]), reference + torch.tensor([[0.0, 0.0], [0.0, 0.2]])
    assert check("near", within)["ok"] and not check("far", beyond)["ok"]
    vocabulary = torch.zeros(2, 10_000)  # a peer's scores over the vocabulary: only the labels' count
    vocabulary[:, rerank.LABELS] = beyond
    assert check("far, over the vocabulary", vocabulary)["error_vs_fp32"] == pytest.approx(0.2)
