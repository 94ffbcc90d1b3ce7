"""A worker whose artifacts were compiled for other bounds than the gateway's (another build, found by
discovery or left over from a rollout) is not served: the compiled bounds are the only ones at run time.
Real gateway over HTTP, real ZeroMQ, two stand-in workers: one of this build, one of another."""

import dataclasses

import pytest

from gateway.worker_link import READY, bounds_differences
from loadgen.standin_worker import BOUNDS, StandInWorker
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.waiting import until

OTHER_BUILD = dataclasses.replace(BOUNDS, max_tokens_per_batch=BOUNDS.max_tokens_per_batch // 2)


@pytest.mark.asyncio(loop_scope="function")
async def test_a_worker_compiled_for_other_bounds_is_named_in_readyz_and_never_sent_work(request_tokenizer):
    same = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    other = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, bounds=OTHER_BUILD).start()
    stack = await start_stack(request_tokenizer, [same, other], wait=False)
    try:
        links = {link.endpoint: link for link in stack.gateway.pool.links}
        await until(lambda: links[same.endpoint].state == READY and links[other.endpoint].refused_because,
                    what="one worker ready, the other refused")
        response = await stack.client.get("/readyz")
        workers = {w["endpoint"]: w for w in (await response.json())["workers"]}
        assert response.status == 200 and links[other.endpoint].state != READY
        assert "refused" not in workers[same.endpoint]
        assert (f"max_tokens_per_batch = {OTHER_BUILD.max_tokens_per_batch} on the worker, "
                f"{BOUNDS.max_tokens_per_batch} here") in workers[other.endpoint]["refused"]
        for _ in range(4):
            status, body, _ = await stack.post("/v1/score", {"samples": ["a b", "c"], "label_token_ids": [1, 2]})
            assert status == 200, body
        assert other.requests == [] and len(same.requests) == 4  # one ScoreRequest per request
    finally:
        await stack.client.close()
        same.stop()
        other.stop()


def test_bounds_differences_resolve_an_unset_prefix_bound_and_name_each_field_that_differs():
    assert bounds_differences(dataclasses.replace(BOUNDS, max_prefix_tokens=None),
                              BOUNDS.resolved()) == []
    assert bounds_differences(BOUNDS, None) == []
    assert bounds_differences(dataclasses.replace(OTHER_BUILD, max_labels=3), BOUNDS) == [
        f"max_tokens_per_batch = {OTHER_BUILD.max_tokens_per_batch} on the worker, {BOUNDS.max_tokens_per_batch} here",
        f"max_labels = 3 on the worker, {BOUNDS.max_labels} here"]
