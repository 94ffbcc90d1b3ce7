"""shared/bounds.py: the typed bounds, the one check per workload, the rules' words, batch bounds."""

import dataclasses

from shared.bounds import (BeamShape, Bounds, Problem, ScoreShape, batch_bounds, batch_capacity, beam_problem,
                           outside_vocabulary, score_problem)
from shared.latency_correction import CorrectedModel
from shared.latency_model import LatencyModel
from shared.work import WorkSize

BOUNDS = Bounds(max_samples_per_batch=8, max_tokens_per_sample=64, max_tokens_per_batch=256, max_labels=4,
                max_top_k=5, max_prompt_tokens=32, max_beam_width=8, max_new_tokens=4,
                max_beam_requests_per_batch=2, max_prefix_tokens=16)


def test_an_unset_prefix_bound_is_a_sample_long_and_resolved_fills_it_in():
    older = dataclasses.replace(BOUNDS, max_prefix_tokens=None)  # a manifest from before the bound
    assert older.limit("max_prefix_tokens") == 64 and older.resolved().max_prefix_tokens == 64
    assert BOUNDS.limit("max_prefix_tokens") == 16 and BOUNDS.resolved() == BOUNDS
    assert older.limit("max_tokens_per_batch") == 256
    assert score_problem(older, ScoreShape(2, 64, 64, 100, 0)) is None
    assert score_problem(BOUNDS, ScoreShape(2, 64, 17, 100, 0)) == Problem("max_prefix_tokens", 17, 16)


def test_a_score_shape_within_bounds_has_no_problem_and_each_bound_is_named():
    fits = ScoreShape(samples=8, longest_sample=64, prefix_tokens=16, tokens=256, labels=4, top_k=5)
    assert score_problem(BOUNDS, fits) is None
    for field, bound in [("samples", "max_samples_per_batch"), ("longest_sample", "max_tokens_per_sample"),
                         ("prefix_tokens", "max_prefix_tokens"), ("tokens", "max_tokens_per_batch"),
                         ("labels", "max_labels"), ("top_k", "max_top_k")]:
        over = dataclasses.replace(fits, **{field: getattr(fits, field) + 1})
        problem = score_problem(BOUNDS, over)
        assert problem == Problem(bound, getattr(fits, field) + 1, getattr(BOUNDS, bound))
        assert f"(bounds.{bound})" in str(problem)


def test_the_first_broken_rule_is_reported():
    both = ScoreShape(samples=9, longest_sample=65, prefix_tokens=0, tokens=65, labels=0)
    assert score_problem(BOUNDS, both).bound == "max_samples_per_batch"
    assert score_problem(BOUNDS, WorkSize(0, (65,)).shape()).bound == "max_tokens_per_sample"


def test_beam_shapes():
    assert beam_problem(BOUNDS, BeamShape(requests=2, longest_prompt=32, num_beams=8, max_new_tokens=4)) is None
    assert beam_problem(BOUNDS, BeamShape(1, 33, 1, 1)) == Problem("max_prompt_tokens", 33, 32)
    assert beam_problem(BOUNDS, BeamShape(3, 33, 9, 1)).bound == "max_beam_width"  # settings before prompts
    assert str(beam_problem(BOUNDS, BeamShape(1, 1, 1, 5))) == (
        "the batch asks max_new_tokens = 5; the compiled bound is 4 decode steps (bounds.max_new_tokens)")


def test_one_rule_worded_for_each_boundary():
    sample = score_problem(BOUNDS, WorkSize(0, (70,)).shape())
    # the gateway names the field and leaves the deployment's setting out (its users' message)
    assert sample.message(part="sample 3", name_bound=False) == (
        "sample 3 is 70 tokens long; the compiled bound is 64 tokens per sample")
    # worker and node: the rule's own subject and the setting
    assert str(sample) == "a sample is 70 tokens long; the compiled bound is 64 tokens per sample " \
                          "(bounds.max_tokens_per_sample)"
    samples = score_problem(BOUNDS, ScoreShape(9, 1, 0, 9, 0))
    assert samples.message("the request").startswith("the request holds 9 samples")
    prompt = beam_problem(BOUNDS, BeamShape(1, 40, 1, 1))
    assert prompt.message("the request", "the prompt", name_bound=False) == (
        "the prompt is 40 tokens long; the compiled bound is 32 prompt tokens")
    assert outside_vocabulary("label token id", 100) == "a label token id outside the vocabulary [0, 100)"


def test_batch_bounds_and_capacity_come_from_the_same_bounds():
    score, beam = batch_bounds(BOUNDS, "score"), batch_bounds(BOUNDS, "beam", max_jobs_per_batch=1)
    assert (score.max_items_per_batch, score.max_tokens_per_batch, score.max_labels, score.max_jobs_per_batch) == (8, 256, 4, 0)
    assert (beam.max_items_per_batch, beam.max_tokens_per_batch, beam.max_labels, beam.max_jobs_per_batch) == (2, None, 0, 1)
    assert batch_capacity(BOUNDS, "score") == (8, 256)
    assert batch_capacity(BOUNDS, "beam") == (16, None)  # beams over all requests; no token bound


def test_a_beam_backlog_is_cut_into_batches_by_beams_alone():
    per_batch = LatencyModel(0.0, 0.0, 0.0, 1.0)  # 1 ms per batch, whatever it holds: the backlog counts batches
    beam = CorrectedModel(per_batch, *batch_capacity(BOUNDS, "beam"))
    assert beam.backlog_ms(items=32, tokens=10**12) == 2.0  # 32 beams in batches of 16; tokens never bound
    score = CorrectedModel(per_batch, *batch_capacity(BOUNDS, "score"))
    assert score.backlog_ms(items=8, tokens=512) == 2.0  # 8 samples fit one batch, 512 tokens need two
