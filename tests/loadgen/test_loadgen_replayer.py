"""The open-loop replayer against a local aiohttp stub that delays (queues) its answers."""

import asyncio
import json

from aiohttp.test_utils import TestServer

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.replayer import ReplayOptions, replay
from loadgen.report import build_report, write_report
from loadgen.trace import TraceRecord, make_trace
from tests.loadgen.stub_gateway import Stub

GAP_MS = 20.0
SERVICE_MS = 200.0


def _trace(n: int, gap_ms: float = GAP_MS):
    return make_trace([TraceRecord(t_ms=i * gap_ms, route="score", sample_tokens=(5, 7)) for i in range(n)])


async def _run(stub: Stub, trace, **options):
    server = TestServer(stub.app())
    await server.start_server()
    try:
        opts = ReplayOptions(url=str(server.make_url("")).rstrip("/"), progress=False, **options)
        return await replay(trace, BodyFactory(BodyOptions()), opts)
    finally:
        await server.close()


async def test_sends_on_schedule_and_latency_includes_queueing():
    # One request every 20 ms into a server that takes 200 ms each, one at a time. An open-loop
    # client sends all six (over 100 ms) before the first answer comes back (at 200 ms); a closed
    # loop would have needed over a second. Latency, from the scheduled time, grows by 180 ms per
    # request: the server's queueing is in it, not hidden.
    run = await _run(Stub(SERVICE_MS), _trace(6))
    results = run.results
    assert [r.outcome for r in results] == ["ok"] * 6
    first_answer = min(r.done_ms for r in results)
    assert all(r.sent_ms < first_answer for r in results), "sends waited for answers"
    assert run.max_in_flight == 6
    for r in results:
        assert -1.0 <= r.lag_ms < 80.0, f"request {r.index} left {r.lag_ms:.1f} ms off schedule"
        queueing = r.index * (SERVICE_MS - GAP_MS)
        assert r.latency_ms >= queueing + SERVICE_MS - 2.0, (r.index, r.latency_ms)


async def test_bodies_have_exact_lengths_and_deadlines():
    stub = Stub(1.0)
    trace = make_trace([TraceRecord(t_ms=0, route="score", sample_tokens=(3, 9), deadline_ms=50),
                        TraceRecord(t_ms=1, route="generate", prompt_tokens=12, beam_width=4)])
    await _run(stub, trace)
    by_kind = {("samples" in b): b for b in stub.received}
    score, generate = by_kind[True], by_kind[False]
    assert [len(s["input_ids"]) for s in score["samples"]] == [3, 9]
    assert score["deadline_ms"] == 50
    assert len(generate["input_ids"]) == 12 and generate["beam_width"] == 4
    assert "deadline_ms" not in generate


async def test_rejections_are_counted_by_code_and_report_has_stages(tmp_path):
    stub = Stub(100.0, max_queue=2)
    burst = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(4,)) for _ in range(6)])
    run = await _run(stub, burst)
    outcomes = sorted(r.outcome for r in run.results)
    assert outcomes.count("queue_full") >= 3 and "ok" in outcomes
    report = build_report(run, slo_ms=1000.0, meta={"test": True})
    assert report["routes"]["score"]["outcomes"]["queue_full"] == outcomes.count("queue_full")
    stages = report["stages"]["from_metrics"]["all"]
    assert stages["worker"]["count"] == outcomes.count("ok")
    assert abs(stages["worker"]["mean_ms"] - 100.0) < 1e-6
    assert report["stages"]["from_headers"]["score"]["worker"]["mean_ms"] == 100.0
    page = write_report(tmp_path, run, report)
    html = page.read_text()
    assert "data:image/png;base64," in html and "queue_full" in html
    assert json.loads((tmp_path / "report.json").read_text())["routes"]["all"]["sent"] == 6
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 6


async def test_speed_and_duration_limit():
    run = await _run(Stub(1.0), _trace(20, gap_ms=20.0), speed=2.0, duration_s=0.1)
    # at twice the speed the gaps are 10 ms; the first 100 ms hold 10 requests
    assert len(run.results) == 10
    assert [r.scheduled_ms for r in run.results][:3] == [0.0, 10.0, 20.0]


async def test_connection_refused_is_an_outcome_not_a_crash():
    opts = ReplayOptions(url="http://127.0.0.1:9", progress=False, timeout_s=2.0)
    run = await replay(_trace(2), BodyFactory(BodyOptions()), opts)
    assert all(r.outcome.startswith("connection_error") for r in run.results)
    await asyncio.sleep(0)
