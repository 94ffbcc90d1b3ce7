"""The worker's pure parts: bounds checks, deadline conversion and splitting, the bounded queue,
the profiling grid. No model needed."""

from __future__ import annotations

import numpy as np
import pytest

from shared import protocol
from shared.bounds import Bounds
from shared.config import WorkerConfig
from worker.batch_queue import BatchQueue, PendingBatch
from worker.bounds_check import BatchRefused, check_beam_batch, check_score_batch
from worker.profiler import MIN_POINTS, beam_grid, profile_workload, score_grid

BOUNDS = Bounds(max_samples_per_batch=8, max_tokens_per_sample=64, max_tokens_per_batch=256,
                max_labels=4, max_top_k=5, max_prompt_tokens=64, max_beam_width=8,
                max_new_tokens=4, max_beam_requests_per_batch=2, max_prefix_tokens=32)
VOCAB = 100


def sreq(rid, lens, labels=(), top_k=0, deadline_ms=100.0, ids=None):
    ids = ids if ids is not None else [1] * sum(lens)
    return protocol.ScoreRequest(rid, deadline_ms, protocol.pack_ids(ids), tuple(lens), tuple(labels), top_k)


def shared(rid, prefix, suffixes):
    """A request sent as one shared prefix plus suffixes."""
    ids = list(prefix) + [t for s in suffixes for t in s]
    return protocol.ScoreRequest(rid, 100.0, protocol.pack_ids(ids), tuple(len(s) for s in suffixes), (), 0, False, len(prefix))


def sbatch(*requests):
    return protocol.ScoreBatch(1, "int32", tuple(requests))


def test_score_requests_out_of_bounds_are_refused_alone():
    batch = sbatch(sreq("ok", [10]), sreq("long", [65]), sreq("k", [2], top_k=6), sreq("labels", [2], (1, 2, 3, 4, 5)),
                   sreq("vocab", [2], ids=[1, VOCAB]), sreq("label-vocab", [2], (VOCAB,)),
                   sreq("samples", [1] * 9), sreq("twice", [2], (9, 9, 8)))
    rejected = check_score_batch(batch, BOUNDS, VOCAB)
    assert sorted(rejected) == [1, 2, 3, 4, 5, 6, 7]  # the batch's first request is served
    assert rejected[1] == "a sample is 65 tokens long; the compiled bound is 64 tokens per sample "\
                          "(bounds.max_tokens_per_sample)"
    assert "top_k = 6" in rejected[2] and "5 label ids" in rejected[3]
    assert "vocabulary [0, 100)" in rejected[4] and "label token id outside" in rejected[5]
    assert "the request holds 9 samples" in rejected[6]
    assert rejected[7] == "a label token id is given twice: it would share its probability with itself"


def test_prompt_logprobs_over_the_compiled_top_k_are_refused_alone():
    asks = lambda rid, n: protocol.ScoreRequest(rid, 100.0, protocol.pack_ids([1] * 4), (4,), (), 0,  # noqa: E731
                                                prompt_logprobs=n)
    rejected = check_score_batch(sbatch(asks("fits", BOUNDS.max_top_k), asks("over", BOUNDS.max_top_k + 1)),
                                 BOUNDS, VOCAB)
    assert list(rejected) == [1]
    assert rejected[1] == ("prompt_logprobs 6 is more than the 5 top tokens per position the deployment is compiled "
                           "for (bounds.max_top_k)")


@pytest.mark.parametrize("requests,what", [
    ([sreq(f"r{i}", [64]) for i in range(5)], "tokens"),
    ([sreq(f"r{i}", [1, 1, 1]) for i in range(3)], "samples"),
    ([sreq("a", [1], (1, 2, 3)), sreq("b", [1], (4, 5))], "5 label ids"),
])
def test_score_batch_totals_beyond_bounds_refuse_the_batch(requests, what):
    with pytest.raises(BatchRefused, match=what) as info:
        check_score_batch(sbatch(*requests), BOUNDS, VOCAB)
    assert info.value.code == protocol.ErrorCode.OUT_OF_BOUNDS


def test_a_shared_prefix_counts_once_and_is_checked_against_its_bound():
    fits = shared("fits", [1] * 30, [[2] * 20] * 6)  # 300 tokens as whole samples, 30 + 120 sent
    over_prefix = shared("prefix", [1] * 33, [[2] * 4] * 2)
    over_sample = shared("sample", [1] * 30, [[2] * 35, [3]])  # prefix + suffix = 65 tokens
    batch = sbatch(fits, over_prefix, over_sample, shared("empty-suffix", [1] * 5, [[], [2]]))
    rejected = check_score_batch(batch, BOUNDS, VOCAB)
    assert sorted(rejected) == [1, 2]
    assert "shared prefix is 33 tokens long" in rejected[1] and "bound is 32" in rejected[1]
    assert "max_prefix_tokens" in rejected[1]
    assert "65 tokens" in rejected[2]
    with pytest.raises(BatchRefused, match="the batch holds 278 tokens"):  # 150 + 128: over 256 together
        check_score_batch(sbatch(fits, sreq("unshared", [64, 64])), BOUNDS, VOCAB)


def test_beam_checks():
    def batch(beams=2, steps=2, n=1, length=3):
        reqs = tuple(protocol.BeamRequest(f"b{i}", 10.0, protocol.pack_ids([1] * length)) for i in range(n))
        return protocol.BeamBatch(1, "int32", beams, steps, 1, reqs)

    assert check_beam_batch(batch(), BOUNDS, VOCAB) == {}
    assert "prompt is 65 tokens long" in check_beam_batch(batch(length=65), BOUNDS, VOCAB)[0]
    for kwargs, what in (({"beams": 9}, "num_beams = 9"), ({"steps": 5}, "max_new_tokens = 5"), ({"n": 3}, "3 requests")):
        with pytest.raises(BatchRefused, match=what):
            check_beam_batch(batch(**kwargs), BOUNDS, VOCAB)


def test_deadlines_convert_to_the_local_clock_and_split():
    batch = sbatch(sreq("a", [1], deadline_ms=5.0), sreq("b", [1], deadline_ms=-1.0), sreq("c", [1], deadline_ms=50.0),
                   sreq("d", [1], deadline_ms=50.0))
    pending = PendingBatch.received(b"peer", batch, now=100.0)
    assert pending.deadlines == pytest.approx((100.005, 99.999, 100.05, 100.05))
    pending.rejected = {3: "too long"}
    assert pending.split(now=100.0) == ([0, 2], [1])
    assert pending.split(now=100.01) == ([2], [0, 1])
    assert pending.split(now=101.0) == ([], [0, 1, 2])


def test_queue_refuses_beyond_capacity_and_stops():
    queue = BatchQueue(capacity=2)
    batches = [PendingBatch.received(b"p", sbatch(sreq(f"r{i}", [1])), now=0.0) for i in range(3)]
    assert queue.offer(batches[0]) and queue.offer(batches[1])
    assert not queue.offer(batches[2]) and queue.depth == 2
    assert queue.take() is batches[0]
    assert queue.offer(batches[2])
    queue.stop(consumers=1)
    assert queue.take() is batches[1] and queue.take() is batches[2] and queue.take() is None


def test_profiling_grid_stays_within_bounds_and_starts_with_corners():
    points = score_grid(BOUNDS)
    assert all(1 <= b <= 8 and 1 <= length <= 64 and b * length <= 256 for b, length in points)
    assert points[:2] == [(1, 4), (8, 32)] and len(set(points)) == len(points)
    beams = beam_grid(BOUNDS)
    assert beams[:2] == [(1, 2, 8), (2, 8, 64)] and len(beams) == 8


def test_profile_fits_the_measured_points_and_respects_the_budget():
    calls = []
    batches = [(b, length, (b, length)) for b, length in score_grid(BOUNDS)]
    config = WorkerConfig(warmup_runs=2, profile_repeats=2)
    profile = profile_workload(calls.append, batches, config, deadline=float("inf"))
    assert len(calls) == 3 + 2 * len(batches)  # warm-up: smallest twice, largest once; then 2 per point
    assert len(profile.samples) == len(batches) and profile.rmse_ms >= 0
    short = profile_workload(lambda batch: None, batches, config, deadline=0.0)
    assert len(short.samples) == MIN_POINTS  # budget spent: stop at the fewest points that fix the fit
    assert [s[:2] for s in short.samples] == [b[:2] for b in batches[:MIN_POINTS]]


def test_the_computed_token_count_matches_the_nodes_layout():
    """WorkSize's computed tokens (what the gateway predicts with) are the tokens the node's layout
    really lays out to compute, and its cached tokens what the node reports, static prefix included."""
    import torch

    from worker.runtime.layout import CPU_BLOCK, padded
    from worker.runtime.layout import lay_out
    from shared.prefix import longest_common_prefix
    from shared.work import StaticPrefix, WorkSize

    rng = np.random.default_rng(0)
    for _ in range(300):
        common = rng.integers(0, 4, size=int(rng.integers(0, 7))).tolist()
        tails = [rng.integers(0, 4, size=int(rng.integers(0, 4))).tolist() for _ in range(rng.integers(1, 4))]
        samples = [(common + tail) or [1] for tail in tails]
        prefix_len = int(rng.integers(0, longest_common_prefix(samples) + 1))
        static = samples[0][: int(rng.integers(1, 4))] if rng.random() < 0.7 else [3, 2]
        suffixes = [s[prefix_len:] for s in samples]
        ids = torch.tensor(samples[0][:prefix_len] + [t for s in suffixes for t in s], dtype=torch.int64)
        layout = lay_out(ids, [len(s) for s in suffixes], [prefix_len], [len(samples)], torch.tensor(static))
        work = WorkSize.of(samples, prefix_len, StaticPrefix(tuple(static)))
        computed = work.computed_tokens  # the layout pads them to whole blocks, and adds a filler sample
        lone = len(samples) < 2 and padded(computed, CPU_BLOCK) == computed  # ... as a block of its own
        assert len(layout.input_ids) == padded(computed, CPU_BLOCK) + (CPU_BLOCK if lone else 0)
        assert layout.cached_tokens[0] == work.cached_tokens == sum(map(len, samples)) - work.computed_tokens
