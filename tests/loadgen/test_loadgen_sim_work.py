"""The simulator's jobs are the gateway's: a trace record's shared prefix is shared by the same rule
and its work counted by the same WorkSize, so the policy sees the same numbers in both."""

import asyncio

import pytest

from gateway import sharing
from gateway.job import Job
from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.sim_world import jobs_of
from loadgen.simulator import SimSettings
from loadgen.trace import TraceError, TraceRecord, parse_record
from shared.bounds import Bounds


def _gateway_jobs(samples, settings: SimSettings):
    """What gateway/scoring.py queues for these token ids under the same bounds and rule."""
    bounds = settings.bounds
    prefix_len = sharing.shared_prefix_len(samples, settings.sharing())
    chunks = sharing.chunks(samples, prefix_len, bounds.max_samples_per_batch, bounds.max_tokens_per_batch)

    async def make():
        return [Job("r", "score", 0.0, chunk, prefix_len=prefix_len) for chunk in chunks]
    return asyncio.run(make())


@pytest.mark.parametrize("lengths,prefix,min_shared", [
    ((40,) * 15, 32, 4),        # a context shared by 15 items: sent once
    ((40,) * 15, 3, 4),         # too short to share
    ((300,) * 20, 200, 4),      # over one batch: every chunk carries the prefix again
    ((64, 70), 64, 4),          # one sample is the prefix itself
])
def test_a_record_with_a_shared_prefix_queues_what_the_gateway_queues(lengths, prefix, min_shared):
    settings = SimSettings(bounds=Bounds(max_samples_per_batch=16, max_tokens_per_batch=4096),
                           min_shared_prefix_tokens=min_shared)
    record = TraceRecord(t_ms=0.0, route="score", sample_tokens=lengths, prefix_tokens=prefix)
    body = BodyFactory(BodyOptions(seed=1)).body(record, index=3)
    samples = [s["input_ids"] for s in body["samples"]]
    assert [len(s) for s in samples] == list(lengths) and record.common_prefix_tokens() == prefix
    sim = jobs_of(0, record, 1.0, settings.batch_bounds("score"), 16, settings.sharing())
    gateway = _gateway_jobs(samples, settings)
    assert [j.work for j in sim] == [j.work for j in gateway]
    assert [(j.samples, j.tokens, j.batch_items, j.latency_tokens) for j in sim] == \
        [(j.samples, j.tokens, j.batch_items, j.latency_tokens) for j in gateway]
    # the same record read back from a body alone shares the same prefix
    from_body = TraceRecord(t_ms=0.0, route="score", body=body)
    assert from_body.common_prefix_tokens() >= prefix


def test_prefix_tokens_round_trip_and_are_checked():
    record = parse_record({"t_ms": 1, "route": "score", "sample_tokens": [10, 12], "prefix_tokens": 8})
    assert record.prefix_tokens == 8 and parse_record(record.to_json()) == record
    with pytest.raises(TraceError, match="prefix_tokens = 11 needs a score line"):
        parse_record({"t_ms": 1, "route": "score", "sample_tokens": [10, 12], "prefix_tokens": 11})
