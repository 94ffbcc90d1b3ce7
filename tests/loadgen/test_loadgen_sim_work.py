"""The simulator's jobs are the gateway's: a trace record's shared prefix is shared by the same rule,
the deployment's static prefix reused alike, and the work counted by the same WorkSize, so the
policy sees the same numbers in both."""

import asyncio
from pathlib import Path

import pytest

from gateway import sharing
from gateway.job import new_job
from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.sim_world import jobs_of
from loadgen.simulator import SimSettings, simulate
from loadgen.standin_worker import standin_manifest
from loadgen.trace import TraceError, TraceRecord, make_trace, parse_record
from shared.bounds import Bounds
from shared.config import load_config
from shared.manifest import ScoreNodeFacts
from shared.work import StaticPrefix


def _gateway_jobs(samples, settings: SimSettings, static_ids: tuple[int, ...] = ()):
    """What gateway/scoring.py queues for these token ids under the same bounds and rule, on a
    deployment whose score node holds the static prefix `static_ids`."""
    bounds = settings.bounds
    prefix_len = sharing.shared_prefix_len(samples, settings.sharing())
    chunks = sharing.chunks(samples, prefix_len, bounds.max_samples_per_batch, bounds.max_tokens_per_batch)

    async def make():
        return [new_job("r", "score", 0.0, chunk, prefix_len=prefix_len, reuse=StaticPrefix(static_ids))
                for chunk in chunks]
    return asyncio.run(make())


ROOT = Path(__file__).resolve().parents[2]
STATIC_IDS = tuple(range(900, 964))
"""The static prefix's ids (its first n), written over the first n ids of every sample (a template's header)."""


@pytest.mark.parametrize("lengths,prefix,min_shared,static,reused", [
    ((40,) * 15, 32, 4, 0, 0),         # a context shared by 15 items: sent once
    ((40,) * 15, 3, 4, 0, 0),          # too short to share
    ((300,) * 20, 200, 4, 0, 0),       # over one batch: every chunk carries the prefix again
    ((64, 70), 64, 4, 0, 0),           # one sample is the prefix itself
    ((40,) * 15, 32, 4, 8, 8),         # the shared context starts with the static prefix: reused once
    ((40,) * 15, 3, 4, 6, 6),          # the static prefix makes a common prefix long enough to share
    ((40,) * 15, 0, 10, 8, 15 * 8),    # too short to share: each sample reuses it
    ((300,) * 20, 200, 4, 16, 2 * 16),  # every chunk's prefix reuses it
    ((64, 70), 64, 4, 64, 0),          # a sample ends with the static prefix: its last token is computed
    ((8, 40), 0, 10, 8, 8),            # unshared, a sample that is the static prefix alone computes it all
    ((40,), 0, 4, 8, 8),               # one sample
])
def test_a_record_with_a_shared_prefix_queues_what_the_gateway_queues(lengths, prefix, min_shared, static, reused):
    settings = SimSettings(bounds=Bounds(max_samples_per_batch=16, max_tokens_per_batch=4096),
                           min_shared_prefix_tokens=min_shared, static_prefix_tokens=static)
    record = TraceRecord(t_ms=0.0, route="score", sample_tokens=lengths, prefix_tokens=prefix)
    body = BodyFactory(BodyOptions(seed=1)).body(record, index=3)
    samples = [s["input_ids"] for s in body["samples"]]
    assert [len(s) for s in samples] == list(lengths) and record.common_prefix_tokens() == prefix
    samples = [list(STATIC_IDS[:static]) + s[static:] for s in samples]  # each starts with the static prefix
    sim = jobs_of(0, record, 1.0, settings.batch_bounds("score"), 16, settings.sharing(), static)
    gateway = _gateway_jobs(samples, settings, STATIC_IDS[:static])
    assert [j.work for j in sim] == [j.work for j in gateway]
    assert sum(j.work.reused_tokens for j in gateway) == reused
    assert [(j.samples, j.tokens, j.batch_items, j.latency_tokens) for j in sim] == \
        [(j.samples, j.tokens, j.batch_items, j.latency_tokens) for j in gateway]
    # the same record read back from a body alone shares the same prefix
    from_body = TraceRecord(t_ms=0.0, route="score", body=body)
    assert from_body.common_prefix_tokens() >= prefix


def test_the_simulator_replays_a_static_prefix_as_reused_tokens():
    """A trace replayed on a deployment with a static prefix costs the workers the computed tokens
    only, as the gateway's jobs count them: 4 samples of 40 share their 16-token static prefix,
    reused, so the batch computes 4 suffixes of 24 (the service sees B and L = computed tokens / B)."""
    trace = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(40,) * 4)])
    for static, tokens_per_sample in ((0, 40), (16, 24)):
        seen = []

        def service(route, items, tokens):
            seen.append((route, items, tokens))
            return 1.0

        results = simulate(trace, SimSettings(static_prefix_tokens=static), service)
        assert [r.status for r in results] == [200]
        assert seen[-1] == ("score", 4, tokens_per_sample), seen


def test_settings_from_a_deployment_take_its_manifests_static_prefix():
    config = load_config(ROOT / "configs/test.toml")
    manifest = standin_manifest(1024, score=ScoreNodeFacts(package="score.pt2", sha256="0", static_prefix_ids=(5, 6, 7)))
    assert SimSettings.from_config(config, manifest).static_prefix_tokens == 3
    assert SimSettings.from_config(config, standin_manifest(1024)).static_prefix_tokens == 0
    assert SimSettings.from_config(config).static_prefix_tokens == 0


def test_prefix_tokens_round_trip_and_are_checked():
    record = parse_record({"t_ms": 1, "route": "score", "sample_tokens": [10, 12], "prefix_tokens": 8})
    assert record.prefix_tokens == 8 and parse_record(record.to_json()) == record
    with pytest.raises(TraceError, match="prefix_tokens = 11 needs a score line"):
        parse_record({"t_ms": 1, "route": "score", "sample_tokens": [10, 12], "prefix_tokens": 11})


def test_a_context_id_round_trips_and_repeats_the_same_prefix_tokens():
    lines = [{"t_ms": i, "route": "score", "sample_tokens": [12, 15], "prefix_tokens": 10, "context": c}
             for i, c in enumerate([3, 4, 3])]
    records = [parse_record(line) for line in lines]
    assert records[0].context == 3 and parse_record(records[0].to_json()) == records[0]
    factory = BodyFactory()
    prefixes = [[s["input_ids"][:10] for s in factory.body(r, i)["samples"]] for i, r in enumerate(records)]
    assert prefixes[0][0] == prefixes[0][1] == prefixes[2][0]  # the same context: the same tokens
    assert prefixes[0][0] != prefixes[1][0]
    suffixes = [factory.body(r, i)["samples"][0]["input_ids"][10:] for i, r in enumerate(records)]
    assert suffixes[0] != suffixes[2]  # the items still differ
    with pytest.raises(TraceError, match="context = 3 names a shared prefix: the line needs prefix_tokens"):
        parse_record({"t_ms": 1, "route": "score", "sample_tokens": [10, 12], "context": 3})


def _session_trace(contexts: int, pages: int, prefix: int = 400, gap_ms: float = 200.0):
    """Each context scored over `pages` requests of 15 items of 20 tokens, one request at a time."""
    records = [TraceRecord(t_ms=gap_ms * (page * contexts + c), route="score", sample_tokens=(prefix + 20,) * 15,
                           prefix_tokens=prefix, context=c)
               for page in range(pages) for c in range(contexts)]
    return make_trace(records)


def test_the_simulator_routes_contexts_to_their_worker_and_replays_its_prefix_cache():
    """8 contexts over 4 requests each on 2 workers: each context is seen twice (inserted on the
    second sighting), then hit twice on the worker that holds it; a hit computes the items only."""
    from loadgen.simulator import Simulator

    computed = []

    def service(route, items, tokens):
        computed.append(items * tokens)
        return 1.0

    trace = _session_trace(8, 4)
    runs = {}
    for budget in (0, 100_000):
        computed.clear()
        simulator = Simulator(SimSettings(workers=2, prefix_cache_tokens=budget, score_deadline_ms=1000.0), service,
                              profile=lambda route, items, tokens: 1.0)  # predictions apart from the compute
        results = simulator.run(trace)
        assert [r.status for r in results] == [200] * len(results)
        runs[budget] = (simulator.prefix_cache_hits(), sum(computed))
    assert runs[0][0]["hits"] == 0 and runs[0][1] == 32 * (400 + 15 * 20)
    assert runs[100_000][0] == {"hits": 16, "misses": 16, "insertions": 8, "evictions": 0, "hit_tokens": 16 * 400}
    assert runs[100_000][1] == 32 * (400 + 15 * 20) - 16 * 400


def test_a_cache_too_small_for_every_context_evicts_and_settings_size_it_from_the_manifest():
    from loadgen.simulator import Simulator, cache_tokens
    from shared.manifest import ModelFacts
    import msgspec

    simulator = Simulator(SimSettings(workers=1, prefix_cache_tokens=1000, score_deadline_ms=1000.0),
                          lambda route, items, tokens: 1.0)
    simulator.run(_session_trace(8, 4))
    stats = simulator.prefix_cache_hits()
    assert stats["evictions"] > 0 and stats["hits"] < 16
    manifest = msgspec.structs.replace(standin_manifest(1024), dtype="float32", model=ModelFacts(
        vocab_size=1024, num_layers=2, num_kv_heads=2, head_dim=16))
    assert cache_tokens(1, manifest) == (1 << 20) // (2 * 2 * 2 * 16 * 4 + 8)
    assert cache_tokens(1, standin_manifest(1024)) == 0  # shapes unknown: not modelled
