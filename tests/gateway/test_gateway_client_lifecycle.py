"""Clients that leave or stall: a closed connection takes its request's work out of the queue and is
counted as `client_closed` (never as a gateway failure); a body still arriving holds a drain open; an
answer given before the body was read closes the connection; a split request's failure says so.

The stand-in worker holds its first batch until the test releases it, so what is queued behind it is
known exactly; events are awaited as states (tests/gateway/waiting.py), never as lengths of time."""

from __future__ import annotations

import asyncio
import threading

import orjson

from loadgen.standin_worker import StandInWorker
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import scrape, sample
from tests.gateway.waiting import until

FULL = {"samples": [{"input_ids": [1, 2]}] * 16, "label_token_ids": [1], "deadline_ms": 10_000}  # one batch


def raw_request(body: bytes, request_id: str, length: int | None = None, **headers: str) -> bytes:
    """A POST /v1/score head and `body` (Content-Length `length`, default the body's)."""
    lines = [b"POST /v1/score HTTP/1.1", b"Host: test", b"Content-Type: application/json",
             b"Content-Length: %d" % (len(body) if length is None else length), b"X-Request-Id: " + request_id.encode()]
    lines += [f"{name}: {value}".encode() for name, value in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def held_stack(request_tokenizer, **gateway):
    """A stack whose one worker holds its first batch, one batch in flight at a time."""
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0,
                              **gateway)
    return stack, worker, gate


async def closed_count(stack) -> float:
    return sample(await scrape(stack), "boundserve_requests_total", route="/v1/score", outcome="client_closed") or 0.0


async def test_a_client_that_closes_while_queued_takes_its_work_out_of_the_queue(request_tokenizer):
    stack, worker, gate = await held_stack(request_tokenizer)
    queue = stack.gateway.batchers["score"]
    try:
        blocker = asyncio.create_task(stack.post("/v1/score", FULL, headers={"X-Request-Id": "blocker"}))
        await until(lambda: worker.requests, what="the worker holding the blocker")
        reader, writer = await asyncio.open_connection(stack.client.host, stack.client.port)
        writer.write(raw_request(orjson.dumps({**FULL, "deadline_ms": 60_000}), "gone"))  # no expiry to end it
        await writer.drain()
        await until(lambda: queue.queued_jobs == 1, what="the request queued behind the blocker")
        writer.close()
        await until(lambda: queue.queued_jobs == 0, what="the closed client's job taken out of the queue")
        assert queue.queued_tokens == 0
        gate.set()
        assert (await blocker)[0] == 200
        assert (await stack.post("/v1/score", FULL))[0] == 200  # the gateway serves on
        assert not any(rid.startswith("gone") for rid in worker.seen_request_ids)  # never computed
        assert await closed_count(stack) == 1
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_client_that_leaves_mid_body_is_client_closed_not_a_gateway_failure(stack):
    reader, writer = await asyncio.open_connection(stack.client.host, stack.client.port)
    writer.write(raw_request(b'{"samples": ', "half", length=100))
    await writer.drain()
    await until(lambda: stack.gateway.requests_in_progress == 1, what="the body being read")
    assert not stack.gateway.idle()  # a drain would wait for it
    writer.close()
    await until(lambda: stack.gateway.requests_in_progress == 0, what="the handler ended")
    page = await scrape(stack)
    assert sample(page, "boundserve_requests_total", route="/v1/score", outcome="client_closed") == 1, page
    assert sample(page, "boundserve_requests_total", route="/v1/score", outcome="internal") is None


async def test_a_body_still_arriving_is_awaited_and_served(stack):
    body = orjson.dumps(FULL)
    reader, writer = await asyncio.open_connection(stack.client.host, stack.client.port)
    writer.write(raw_request(body[:10], "slow", length=len(body)))
    await writer.drain()
    await until(lambda: stack.gateway.requests_in_progress == 1, what="the body being read")
    writer.write(body[10:])
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert stack.gateway.requests_in_progress == 0 and stack.gateway.idle()


async def test_an_answer_given_before_the_body_was_read_closes_the_connection(stack):
    """413 on the declared length: what the client sends next would be read as the rest of that body."""
    reader, writer = await asyncio.open_connection(stack.client.host, stack.client.port)
    writer.write(raw_request(b"", "huge", length=50 << 20))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length"))
    body = await reader.readexactly(length)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413") and b"Connection: close" in head, head  # not to be reused
    assert orjson.loads(body)["error"]["code"] == "too_large"


async def test_a_split_request_that_fails_says_how_it_was_split(request_tokenizer):
    """Two batches; the second expires in the queue while the worker holds the first."""
    stack, worker, gate = await held_stack(request_tokenizer)
    try:
        body = {**FULL, "samples": FULL["samples"] * 2, "deadline_ms": 300}
        status, answer, _ = await stack.post("/v1/score", body)
        assert status == 504 and answer["error"]["code"] == "deadline_exceeded", answer
        assert "(one of the 2 batches this request was split into; 1 had been sent to a worker, 0 answered)" in \
            answer["error"]["message"], answer
    finally:
        gate.set()
        await stack.client.close()
        worker.stop()


async def test_client_closed_is_for_logs_and_metrics_only(stack):
    """No client can receive it: /openapi.json lists neither its status nor its code."""
    document = await (await stack.client.get("/openapi.json")).text()
    assert "client_closed" not in document and '"499"' not in document
