"""The replayer's retry on another replica (loadgen/retry.py): behind two real gateways (one with no
worker ready, so the gateway's own 503 refuses; one before a stand-in worker speaking the real
protocol), and against two socket servers that answer as told (Retry-After, a try never answered)."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.replayer import ReplayOptions, replay
from loadgen.retry import RetryOptions, retry_after_s
from loadgen.standin_worker import StandInWorker
from loadgen.trace import TraceRecord, make_trace
from tests.gateway.conftest import endpoint, start_stack
from tests.loadgen.test_loadgen_http1 import Server, answer

REFUSED = answer(429, b'{"error":{"code":"queue_full"}}', "Retry-After: 1")
OK = answer(200, b'{"id":"x"}')


def _trace(*deadlines_ms: float):
    return make_trace([TraceRecord(t_ms=float(i), route="score", sample_tokens=(5, 7), deadline_ms=d)
                       for i, d in enumerate(deadlines_ms)])


def _url(stack) -> str:
    return str(stack.client.make_url("")).rstrip("/")


def _budget(request: bytes) -> int:
    return int(request.split(b"X-Deadline-Ms: ")[1].split(b"\r\n")[0])


class Holding(Server):
    """Reads each request and never answers until `release` is set; counts connections closed by the client."""

    def __init__(self) -> None:
        super().__init__([])
        self.release, self.closed = asyncio.Event(), 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        reading = asyncio.ensure_future(reader.read())   # b"" when the client closes its end
        released = asyncio.ensure_future(self.release.wait())
        done, _ = await asyncio.wait({reading, released}, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            self.closed += 1
        for task in (reading, released):
            task.cancel()
        writer.close()


async def test_a_request_refused_by_a_real_gateway_is_retried_once_on_the_other(request_tokenizer):
    absent = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size)  # never started: no worker ready
    serving = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    refusing = await start_stack(request_tokenizer, [absent], wait=False)
    answering = await start_stack(request_tokenizer, [serving])
    try:
        options = ReplayOptions(url=_url(refusing), replicas=(_url(answering),), retry=RetryOptions(),
                                progress=False, scrape_metrics=False)
        run = await replay(_trace(30_000, 30_000, 30_000, 30_000), BodyFactory(), options)
    finally:
        await refusing.client.close()
        await answering.client.close()
        serving.stop()
    results = run.results
    assert [r.outcome for r in results] == ["ok"] * 4
    assert [(r.tries, r.replica, r.first_outcome) for r in results] == [
        (2, 1, "no_workers"), (1, 1, None), (2, 1, "no_workers"), (1, 1, None)]
    assert all(r.first_done_ms <= r.done_ms and r.try_ms > 0 for r in results if r.tries == 2)
    assert len(serving.requests) == 4   # each request computed once, on the replica that had a worker
    assert all(0 < r.deadline_ms < 30_000 for r in serving.requests)


async def test_retry_after_is_honoured_and_a_retry_never_leaves_past_the_deadline():
    refusing, answering = Server([REFUSED] * 2), Server([OK] * 2)
    async with refusing as first, answering as second:
        options = ReplayOptions(url=first, replicas=(second,), retry=RetryOptions(), progress=False,
                                scrape_metrics=False)
        run = await replay(_trace(300, 5000, 5000), BodyFactory(), options)
    short, other, long = run.results
    # Retry-After 1 s is past a 300 ms deadline: the refusal stands, nothing is sent again
    assert (short.outcome, short.tries, short.not_retried) == ("queue_full", 1, "retry_after_past_deadline")
    assert (other.outcome, other.tries, long.outcome, long.tries) == ("ok", 1, "ok", 2)
    assert long.first_outcome == "queue_full" and len(answering.requests) == 2
    retried = answering.requests[1]
    budget = _budget(retried)
    # it left at least 1 s after the refusal, with no more than what was left of 5000 ms then
    assert 1 <= budget <= 5000 - 1000 - (long.first_done_ms - long.scheduled_ms)
    assert b'"deadline_ms":5000' in retried   # the body unchanged: the header's smaller budget wins


async def test_a_first_try_unanswered_for_its_share_of_the_deadline_is_given_up_and_retried():
    holding, answering = Holding(), Server([OK])
    async with holding as first, answering as second:
        options = ReplayOptions(url=first, replicas=(second,), progress=False, scrape_metrics=False,
                                retry=RetryOptions(first_try_timeout_share=0.5))
        run = await replay(_trace(400), BodyFactory(), options)
        holding.release.set()
    (result,) = run.results
    assert (result.outcome, result.tries, result.first_outcome, result.replica) == ("ok", 2, "client_timeout", 1)
    assert holding.closed == 1   # the given-up try's connection was closed (the gateway takes its work out)
    assert 1 <= _budget(answering.requests[0]) <= 400 - (result.first_done_ms - result.scheduled_ms)


async def test_a_try_that_timed_out_at_its_deadline_is_not_retried():
    holding, answering = Holding(), Server([])
    async with holding as first, answering as second:
        options = ReplayOptions(url=first, replicas=(second,), retry=RetryOptions(), timeout_s=0.3,
                                progress=False, scrape_metrics=False)
        run = await replay(_trace(300), BodyFactory(), options)
        holding.release.set()
    (result,) = run.results
    assert (result.outcome, result.tries, result.not_retried) == ("client_timeout", 1, "no_time_left")
    assert answering.requests == []


async def test_retries_without_a_second_replica_or_a_deadline_are_refused_by_name():
    with pytest.raises(ValueError, match="another replica"):
        await replay(_trace(100), BodyFactory(), ReplayOptions(retry=RetryOptions(), progress=False,
                                                                scrape_metrics=False))
    without = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(3,))])
    options = ReplayOptions(replicas=("http://127.0.0.1:1",), retry=RetryOptions(), progress=False,
                            scrape_metrics=False)
    with pytest.raises(ValueError, match="1 request\\(s\\) have none"):
        await replay(without, BodyFactory(), options)
    await _deadline_from_factory(options)  # a default deadline from the body factory is enough
    with pytest.raises(ValueError, match="first_try_timeout_share"):
        RetryOptions(first_try_timeout_share=1.0)


async def _deadline_from_factory(options: ReplayOptions) -> None:
    async with Server([OK]) as url:
        run = await replay(make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(3,))]),
                           BodyFactory(BodyOptions(deadline_ms=1000)),
                           ReplayOptions(url=url, replicas=options.replicas, retry=RetryOptions(), progress=False,
                                         scrape_metrics=False))
    assert run.results[0].outcome == "ok"


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert retry_after_s({}) == 0.0 and retry_after_s({"retry-after": "soon"}) == 0.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT"}, now_unix=1445412480.0) == 5.0
