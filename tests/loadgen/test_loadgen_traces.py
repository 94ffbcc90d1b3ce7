"""Native traces, importers of the public formats (sample files written here), synthetic arrivals."""

import json
import statistics

import pytest

from loadgen.importers import ImportOptions, import_trace, split_tokens
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import TraceError, TraceRecord, make_trace, read_trace, write_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.1000000,30,3
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""

MOONCAKE = "\n".join(json.dumps(row) for row in [
    {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1, 2]},
    {"timestamp": 27, "input_length": 100, "output_length": 2, "hash_ids": [0, 3]},
    {"timestamp": 40, "input_length": 15, "output_length": 9, "hash_ids": [4]},
]) + "\n"


def test_azure_rows_become_score_requests_with_exact_total_tokens(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    trace = import_trace(path, "azure", ImportOptions(route="score", samples_per_request=15))
    times = [r.t_ms for r in trace.records]
    assert times == pytest.approx([0.0, 580.59, 4895.169], abs=1e-3)
    first, second, third = trace.records
    assert first.sample_tokens == (2,) * 15           # 30 tokens in 15 samples
    assert sum(second.sample_tokens) == 374 and len(second.sample_tokens) == 15
    assert max(second.sample_tokens) - min(second.sample_tokens) <= 1
    assert (second.output_tokens, third.output_tokens) == (44, 109)
    assert trace.meta["columns_used"] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    assert trace.meta["clipped_rows"] == 0


def test_burstgpt_rows_become_generate_requests_with_clipping_counted(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT)
    options = ImportOptions(route="generate", max_prompt_tokens=512, max_new_tokens=4, beam_width=8)
    trace = import_trace(path, "burstgpt", options)
    assert [r.t_ms for r in trace.records] == [0.0, 40_000.0, 113_000.0]
    assert [r.prompt_tokens for r in trace.records] == [472, 512, 417]
    assert [r.max_new_tokens for r in trace.records] == [4, 1, 4]  # 0 response tokens -> at least 1
    assert [r.output_tokens for r in trace.records] == [18, 0, 276]
    assert all(r.beam_width == 8 and r.route == "generate" for r in trace.records)
    assert trace.meta["clipped_rows"] == 1


def test_mooncake_jsonl_times_in_ms_and_mix_is_seeded(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text(MOONCAKE)
    options = ImportOptions(route="mix", score_fraction=0.5, samples_per_request=10, seed=3)
    trace = import_trace(path, "mooncake", options)
    assert [r.t_ms for r in trace.records] == [0.0, 27.0, 40.0]
    again = import_trace(path, "mooncake", options)
    assert [r.route for r in trace.records] == [r.route for r in again.records]
    for record, tokens in zip(trace.records, (6955, 100, 15)):
        if record.route == "score":
            assert sum(record.sample_tokens) == min(tokens, 10 * 512)
        else:
            assert record.prompt_tokens == min(tokens, 512)


def test_importer_errors_name_line_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,3\n2.0,lots,3\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: ContextTokens"):
        import_trace(path, "azure")
    path.write_text("Timestamp,Request tokens\n1,2\n")
    with pytest.raises(TraceError, match="missing column 'Response tokens'"):
        import_trace(path, "burstgpt")


def test_split_tokens_keeps_total_and_never_exceeds_tokens():
    assert split_tokens(7, 15, 512) == ((1,) * 7, False)
    assert split_tokens(31, 3, 512) == ((11, 10, 10), False)
    assert split_tokens(2000, 2, 512) == ((512, 512), True)


def test_native_trace_round_trip_and_line_numbered_errors(tmp_path):
    records = [TraceRecord(t_ms=0.0, route="score", sample_tokens=(3, 4), deadline_ms=80.0, group=1),
               TraceRecord(t_ms=2.5, route="generate", prompt_tokens=9, beam_width=4, max_new_tokens=2),
               TraceRecord(t_ms=3.0, route="score", body={"samples": ["hi"], "labels": ["a"]})]
    path = tmp_path / "t.jsonl"
    write_trace(make_trace(records, {"source": "test"}), path)
    back = read_trace(path)
    assert back.records == tuple(records) and back.meta == {"source": "test"}
    path.write_text('{"t_ms": 0, "route": "score", "samples": 2, "tokens_per_sample": 5}\n'
                    '{"t_ms": 1, "route": "nope", "prompt_tokens": 3}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: route must be one of"):
        read_trace(path)
    path.write_text('{"t_ms": 0, "route": "score"}\n')
    with pytest.raises(TraceError, match="needs body, sample_tokens"):
        read_trace(path)


def test_record_shapes_follow_the_latency_model_convention():
    score = TraceRecord(t_ms=0, route="score", sample_tokens=(10, 20, 30))
    assert score.shape() == (3, 20.0) and score.total_tokens() == 60
    beam = TraceRecord(t_ms=0, route="generate", prompt_tokens=50)
    assert beam.shape(default_beam_width=8) == (8, 50.0)


def test_poisson_and_gamma_arrivals_have_their_rate_and_variability():
    poisson = synthesize(SynthSpec(arrivals="poisson", rate_rps=500, duration_s=40, seed=1))
    gaps = _gaps(poisson)
    assert poisson.rate_rps() == pytest.approx(500, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)
    bursty = synthesize(SynthSpec(arrivals="gamma", rate_rps=500, cv=3.0, duration_s=40, seed=1))
    gaps = _gaps(bursty)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(3.0, rel=0.15)
    assert synthesize(SynthSpec(seed=5)).records == synthesize(SynthSpec(seed=5)).records


def test_bursts_send_groups_together_and_mix_routes():
    spec = SynthSpec(arrivals="bursts", rate_rps=400, burst_size=8, burst_spread_ms=1.0, duration_s=5,
                     score_fraction=0.75, samples=15, tokens_per_sample=40, prompt_tokens=30, seed=2)
    trace = synthesize(spec)
    groups = {}
    for r in trace.records:
        groups.setdefault(r.group, []).append(r.t_ms)
    full = [ts for ts in groups.values() if len(ts) == 8]
    assert len(full) >= len(groups) - 1
    assert all(max(ts) - min(ts) <= 1.0 for ts in groups.values())
    routes = [r.route for r in trace.records]
    assert routes.count("score") / len(routes) == pytest.approx(0.75, abs=0.05)
    assert all(r.sample_tokens == (40,) * 15 for r in trace.records if r.route == "score")


def _gaps(trace):
    times = [r.t_ms for r in trace.records]
    return [b - a for a, b in zip(times, times[1:])]
