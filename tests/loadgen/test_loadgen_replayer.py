"""The open-loop replayer against the real gateway, whose stand-in worker holds answers until released.

Holding the worker's answers makes the order of events known without any sleep: every request of
the trace must leave while none has been answered, and then latency must include the wait.
"""

import asyncio

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.replayer import ReplayOptions, prepare, replay
from loadgen.report import build_report, write_report
from loadgen.trace import TraceRecord, make_trace
from tests.gateway.waiting import until
from tests.loadgen.conftest import gated

GAP_MS = 20.0


def _trace(n: int, gap_ms: float = GAP_MS, **fields):
    return make_trace([TraceRecord(t_ms=i * gap_ms, route="score", sample_tokens=(5, 7), **fields) for i in range(n)])


def _options(stack, **options) -> ReplayOptions:
    return ReplayOptions(url=str(stack.client.make_url("")).rstrip("/"), progress=False, **options)


def _received(stack) -> int:
    """Requests the gateway holds: at the worker, or queued behind it."""
    return len(stack.workers[0].requests) + stack.gateway.batchers["score"].queued_jobs


async def test_every_request_leaves_on_schedule_while_none_is_answered(gated_stack):
    stack = gated_stack
    trace = _trace(6, deadline_ms=30_000)
    run = asyncio.create_task(replay(trace, BodyFactory(), _options(stack)))
    await until(lambda: _received(stack) == 6, what="all six requests at the gateway")
    stack.workers[0].gate.set()
    results = (await run).results
    assert [r.outcome for r in results] == ["ok"] * 6
    first_answer = min(r.done_ms for r in results)
    assert all(r.sent_ms < first_answer for r in results), "a send waited for an answer"
    assert (await run).max_in_flight == 6
    last_scheduled = max(r.scheduled_ms for r in results)
    for r in results:  # no answer came before the last send: each waited at least that long
        assert r.latency_ms > last_scheduled - r.scheduled_ms


async def test_bodies_carry_exact_lengths_and_deadlines_to_the_worker(gated_stack):
    stack = gated_stack
    stack.workers[0].gate.set()
    trace = make_trace([TraceRecord(t_ms=0, route="score", sample_tokens=(3, 9), deadline_ms=5000),
                        TraceRecord(t_ms=1, route="score", sample_tokens=(4,))])
    run = await replay(trace, BodyFactory(BodyOptions(deadline_ms=60_000)), _options(stack))
    assert [r.outcome for r in run.results] == ["ok", "ok"]
    by_lengths = {tuple(r.sample_lens): r for r in stack.workers[0].requests}
    assert set(by_lengths) == {(3, 9), (4,)}
    assert 0 < by_lengths[(3, 9)].deadline_ms <= 5000               # its own deadline, counting down
    assert 5000 < by_lengths[(4,)].deadline_ms <= 60_000            # the replay's default


async def test_refusals_are_counted_by_code_and_the_report_has_the_gateways_stages(request_tokenizer, tmp_path):
    async with gated(request_tokenizer, max_queue_tokens=10) as stack:
        run = await _held_then_burst(stack)
    outcomes = sorted(r.outcome for r in run.results)
    assert outcomes == ["ok", "ok", "queue_full", "queue_full", "queue_full"]  # 4 + 4 tokens fit; 12 would not
    report = build_report(run, slo_ms=30_000.0, meta={"test": True})
    assert report["routes"]["score"]["outcomes"] == {"ok": 2, "queue_full": 3}
    stages = report["stages"]["from_metrics"]["all"]
    # the burst's five, and the held request, answered while the burst ran; two were queued and sent
    assert stages["total"]["count"] == 6 and stages["queue"]["count"] == 2
    page = write_report(tmp_path, run, report)
    assert "data:image/png;base64," in page.read_text() and "queue_full" in page.read_text()
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 5


async def _held_then_burst(stack):
    """One request held at the worker, then a burst of five 4-token requests against the queue budget."""
    held = asyncio.create_task(replay(_trace(1, deadline_ms=30_000), BodyFactory(), _options(stack)))
    await until(lambda: stack.workers[0].requests, what="the worker holding the first request")
    burst = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(4,), deadline_ms=30_000)
                        for _ in range(5)])
    run_task = asyncio.create_task(replay(burst, BodyFactory(), _options(stack)))
    await until(lambda: stack.gateway.batchers["score"].queued_jobs == 2, what="two requests queued")
    queue_full = {"reason": "queue_full"}
    await until(lambda: run_task.done() or stack.gateway.metrics.value("boundserve_drops_total", **queue_full) == 3,
                what="three refused")
    stack.workers[0].gate.set()
    run, _ = await run_task, await held
    return run


def test_speed_and_duration_limit():
    prepared = prepare(_trace(20, gap_ms=20.0), ReplayOptions(speed=2.0, duration_s=0.1))
    # at twice the speed the gaps are 10 ms; the first 100 ms hold 10 requests
    assert len(prepared.records) == 10
    assert [r.t_ms for r in prepared.records][:3] == [0.0, 10.0, 20.0]


async def test_connection_refused_is_an_outcome_not_a_crash():
    opts = ReplayOptions(url="http://127.0.0.1:9", progress=False, timeout_s=2.0)
    run = await replay(_trace(2), BodyFactory(BodyOptions()), opts)
    assert all(r.outcome.startswith("connection_error") for r in run.results)
