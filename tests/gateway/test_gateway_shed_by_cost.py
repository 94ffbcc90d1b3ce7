"""[gateway] shed_by_cost through a real gateway in front of the stand-in worker: on by default,
it reaches admission (false turns it off), requests are served as before, and a hopeless one is
refused before any work, worded by why (the policy's own tests cover the refusal for cost)."""

from __future__ import annotations

import pytest

from loadgen.standin_worker import StandInWorker
from shared.latency_model import LatencyModel
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.test_gateway_rejections import assert_error


@pytest.mark.parametrize("setting", [{}, {"shed_by_cost": False}], ids=["default", "off"])
async def test_shed_by_cost_is_on_by_default_and_a_hopeless_request_is_refused_before_any_work(request_tokenizer,
                                                                                                setting):
    slow = LatencyModel(0.0, 0.0, 0.0, 50.0)  # every batch takes 50 ms, and its profile says so
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=slow, delay_ms=50).start()
    stack = await start_stack(request_tokenizer, [worker], **setting)
    try:
        assert stack.gateway.batchers["score"].scheduler.settings.admission.shed_by_cost is setting.get("shed_by_cost", True)
        for _ in range(3):  # measured batches confirm the profile
            assert (await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 5000}))[0] == 200
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10},
                                           headers={"X-Request-Id": "hopeless-1"})
        assert_error(status, body, 503, "deadline_unmeetable", "past the deadline", "refused before any work")
        assert not any(rid.startswith("hopeless") for rid in worker.seen_request_ids)
    finally:
        await stack.client.close()
        worker.stop()
