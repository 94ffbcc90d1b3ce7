"""The compose stack's own commands and config, run outside containers, answer a request.

The worker-cpu and gateway commands are taken from docker-compose.yml and run here unchanged except
for what a container provides: this interpreter for `python`, the compiled demo artifacts for the
`artifacts` volume, configs/compose.toml with the worker's service name pointed at a loopback port,
and free ports for 5555/8000. Then the gateway's own health check command (also from the compose
file) passes, and /v1/score answers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from loadgen import live
from loadgen.processes import free_port, stop_all, tail
from tests.builds import without_bounds
from tests.deploy.stack import ROOT, load_compose, module_argv, start

pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once, cached)
READY_TIMEOUT_S = 240.0


def wait_ready(url: str, processes, logs) -> None:
    """loadgen's wait-ready on the stack's processes; a failure shows their logs."""
    try:
        asyncio.run(live.wait_ready(url, READY_TIMEOUT_S, processes))
    except (RuntimeError, TimeoutError) as exc:
        raise AssertionError(f"{exc}:\n" + "\n".join(tail(log) for log in logs)) from None


def post_json(url: str, body: dict, timeout_s: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def local_config(tmp_path, service_host: str, port: int, artifacts) -> str:
    """configs/compose.toml with `service_host:5555` made reachable here as 127.0.0.1:port, and its
    worker's cpu_threads set to what the stand-in artifacts were compiled for (the compose build
    compiles for compose.toml's own count; a worker refuses artifacts compiled for another), without
    [bounds] (the suite's build is smaller than compose.toml's: the compiled bounds are served)."""
    text = (ROOT / "configs/compose.toml").read_text()
    assert f"tcp://{service_host}:5555" in text and "cpu_threads = 2" in text
    compiled = json.loads((artifacts / "manifest.json").read_text())["cpu_threads"]
    path = tmp_path / "configs" / "compose.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(without_bounds(text.replace(f"tcp://{service_host}:5555", f"tcp://127.0.0.1:{port}")
                                   .replace("cpu_threads = 2", f"cpu_threads = {compiled}")))
    return str(path)


def test_compose_commands_serve_a_request_outside_containers(demo_artifacts, tmp_path):
    services = load_compose()["services"]
    worker_port, http_port = free_port(), free_port()
    config = local_config(tmp_path, "worker-cpu", worker_port, demo_artifacts)
    replace = {
        "/app/configs/compose.toml": config,
        "/artifacts/demo": str(demo_artifacts),
        "tcp://0.0.0.0:5555": f"tcp://127.0.0.1:{worker_port}",
        "0.0.0.0": "127.0.0.1",
        "8000": str(http_port),
    }
    logs = [tmp_path / "worker.log", tmp_path / "gateway.log"]
    processes = [start(module_argv(services[name]["command"], replace), log)
                 for name, log in zip(("worker-cpu", "gateway"), logs)]
    url = f"http://127.0.0.1:{http_port}"
    try:
        wait_ready(url, processes, logs)
        check = [sys.executable if t == "python" else t.replace(":8000/", f":{http_port}/")
                 for t in services["gateway"]["healthcheck"]["test"][1:]]
        assert subprocess.run(check, timeout=30).returncode == 0, "the compose health check fails"
        status, body = post_json(url + "/v1/score", {"samples": ["red running shoe", "blue phone case"],
                                                     "labels": ["yes", "no"], "deadline_ms": 10_000})
        assert status == 200, body
        assert len(body["scores"]) == 2 and all(abs(sum(row) - 1.0) < 1e-4 for row in body["scores"])
    finally:
        stop_all(processes)
    assert [p.returncode for p in processes] == [0, 0], "\n".join(tail(log) for log in logs)
