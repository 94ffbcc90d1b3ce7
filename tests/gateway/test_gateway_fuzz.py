"""schemathesis against /openapi.json of a real `python -m gateway` process: no 5xx, no hang.

The gateway runs as its own process (as deployed) in front of a stand-in worker process. The only
5xx answers allowed are the ones about the request's own deadline (a fuzzed deadline_ms of 1 ms
is legitimately unmeetable): 503 deadline_unmeetable and 504 deadline_exceeded.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from loadgen.live import wait_ready
from loadgen.processes import free_port
from loadgen.stack import start_standin_stack

DEADLINE_CODES = {"deadline_unmeetable", "deadline_exceeded"}


@pytest.fixture(scope="module")
def gateway_url(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    tokenizer.save(str(folder / "tokenizer.json"))
    port = free_port()
    gateway, worker = start_standin_stack(folder, port, 1024, "fuzz")
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, 30.0, (worker, gateway)))
        yield url
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=15) == 0, "the gateway did not drain and exit 0 on SIGTERM"
        worker.kill()
        worker.wait()


@pytest.fixture(scope="module")
def api_schema(gateway_url):
    return schemathesis.openapi.from_dict(requests.get(gateway_url + "/openapi.json", timeout=5).json())


def no_unexpected_server_error(ctx, response, case) -> None:
    if response.status_code >= 500:
        code = json.loads(response.content or b"{}").get("error", {}).get("code")
        assert code in DEADLINE_CODES, f"{response.status_code} {code}: {response.content[:300]!r}"


CHECKS = [no_unexpected_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def test_fuzzed_requests_get_no_server_error_and_no_hang(api_schema, gateway_url):
    # schemathesis' own pytest plugin does not load under this pytest; drive its strategies directly.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/score", "POST /v1/generate"}
    for operation in operations:
        examples = 60 if operation.method.upper() == "POST" else 5

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            response = case.call(base_url=gateway_url, timeout=10)  # a hang fails as a timeout
            case.validate_response(response, checks=CHECKS)

        run()
