"""The finish recorded when a batch is sent is predicted for what its worker will compute.

A job is sized at arrival for its context's home worker; by the time it is sent that worker's prefix
cache may hold the context, so it computes less. The prediction the learnt lateness is measured
against must be the resized batch's, in the simulator as in the gateway (one scheduler makes it)."""

import pytest

from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import TraceRecord, make_trace
from shared.latency_model import LatencyModel
from loadgen.service import ServiceModel

SERVICE = ServiceModel({"score": LatencyModel(0.001, 0.0, 0.0, 1.0)})  # 1 ms a batch + 1 us a token an item


def test_with_an_exact_model_the_finish_recorded_at_send_is_the_finish_that_happened():
    # all at once, one request a batch, one batch in flight: the context is inserted in the cache at its
    # second sighting (the second batch), so the third and fourth requests, queued while it was a miss,
    # are sent as hits and compute their suffixes only
    records = [TraceRecord(t_ms=0.0, route="score", sample_tokens=(200, 210), prefix_tokens=190, context=7)
               for i in range(4)]
    settings = SimSettings(prefix_cache_tokens=10_000, max_batch_requests=1, score_deadline_ms=1000.0,
                           max_inflight_batches=1)
    simulator = Simulator(settings, SERVICE)
    results = simulator.run(make_trace(records))
    assert all(r.outcome == "ok" for r in results)
    assert simulator.prefix_cache_hits()["hits"] >= 1, "no job was resized at send: the test shows nothing"
    for index, result in enumerate(results):
        (job,) = simulator.requests[index].jobs
        assert job.dispatched.finish_at * 1000.0 == pytest.approx(result.done_ms), index
