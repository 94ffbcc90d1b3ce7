"""A stack of real processes whose worker runs on a CPU of its own, shared by two gateways with
different policies (what bench/overload.py measures with)."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from loadgen.stack import GatewayProcess, Pinning, SharedWorkers

pytestmark = pytest.mark.slow  # the compiled demo artifacts, and real worker and gateway processes


async def _score(url: str, deadline_ms: int) -> int:
    body = {"samples": [{"input_ids": [11, 12, 13]}], "label_token_ids": [10], "deadline_ms": deadline_ms}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/score", json=body) as response:
        await response.read()
        return response.status


def test_two_gateways_share_one_pinned_worker(heavy_deployment, tmp_path):
    config, artifacts = heavy_deployment
    pinning = Pinning.split()
    caller = os.sched_getaffinity(0)
    with SharedWorkers(config, artifacts, tmp_path, pinning) as workers:
        gateways = [GatewayProcess(workers, "refusing", {"admission": True}).start(),
                    GatewayProcess(workers, "fcfs", {"admission": False, "queue_order": "arrival"}).start()]
        try:
            for gateway in gateways:
                asyncio.run(gateway.ready())
            fcfs = gateways[1].config_text
            assert "admission = false" in fcfs and 'queue_order = "arrival"' in fcfs
            assert [asyncio.run(_score(g.url, 30_000)) for g in gateways] == [200, 200]
            if pinning is not None:  # a one-CPU machine runs everything everywhere
                assert os.sched_getaffinity(workers.pids[0]) == set(pinning.worker_cpus)
                assert os.sched_getaffinity(gateways[0].pid) == set(pinning.gateway_cpus)
                assert not pinning.worker_cpus & pinning.gateway_cpus
        finally:
            for gateway in gateways:
                gateway.stop()
    assert os.sched_getaffinity(0) == caller  # only pin_caller moves the caller
