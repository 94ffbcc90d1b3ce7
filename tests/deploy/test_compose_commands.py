"""Every command docker-compose.yml and deploy/k8s run exists in the project, with consistent files and ports.

For each `python -m MODULE --flag value ...`: the module runs `--help` here and lists every flag used;
each /app/configs/X is a file of configs/ that loads; worker endpoints bound in containers match the
endpoints the same config gives the gateway (service name or pod DNS name, port); the gateway's
--port matches the published port, the health check, the probes and Prometheus' target.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from urllib.parse import urlparse

import pytest
import yaml

from shared.config import load_config
from tests.deploy.stack import (CONFIGS_IN_CONTAINER, ROOT, k8s_containers, k8s_documents, load_compose,
                                module_and_flags)

GPU_ENV = {"BOUNDSERVE_CONFIG": "compose-gpu.toml"}


def compose_commands() -> list[tuple[str, list[str]]]:
    """(service, command) for every project command, with default and GPU-mode variables."""
    found = []
    for env in ({}, GPU_ENV):
        for name, service in load_compose(env)["services"].items():
            if service.get("command", [None])[0] == "python":
                found.append((name, service["command"]))
    return found


def all_commands() -> list[tuple[str, list[str]]]:
    k8s = [(f"k8s:{c['name']}", c["command"]) for c in k8s_containers()]
    return compose_commands() + k8s


@functools.cache
def help_text(module: str) -> str:
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, f"python -m {module} --help failed:\n{result.stderr[-2000:]}"
    return result.stdout


@pytest.mark.parametrize("where, command", all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_module_exists_and_accepts_every_flag(where, command):
    module, flags = module_and_flags(command)
    text = help_text(module)
    missing = [flag for flag in flags if flag not in text]
    assert not missing, f"{where}: `python -m {module}` has no flag(s) {missing}"


@pytest.mark.parametrize("where, command", all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_config_files_exist_and_load(where, command):
    _, flags = module_and_flags(command)
    config = flags.get("--config")
    if config is None:
        return
    assert config.startswith(CONFIGS_IN_CONTAINER), f"{where}: configs come from the mounted configs/: {config}"
    path = ROOT / "configs" / config.removeprefix(CONFIGS_IN_CONTAINER)
    assert path.is_file(), f"{where}: {path} does not exist"
    load_config(path)


def endpoint_host_port(endpoint: str) -> tuple[str, int]:
    parsed = urlparse(endpoint)
    assert parsed.scheme == "tcp", f"containers talk over tcp://, got {endpoint}"
    return parsed.hostname, parsed.port


@pytest.mark.parametrize("env", [{}, GPU_ENV], ids=["cpu", "gpu"])
def test_worker_endpoints_match_the_gateway_config(env):
    services = load_compose(env)["services"]
    _, gateway_flags = module_and_flags(services["gateway"]["command"])
    config = load_config(ROOT / "configs" / gateway_flags["--config"].removeprefix(CONFIGS_IN_CONTAINER))
    for endpoint in config.worker.endpoints:
        host, port = endpoint_host_port(endpoint)
        assert host in services, f"{endpoint}: no compose service named {host}"
        _, flags = module_and_flags(services[host]["command"])
        assert endpoint_host_port(flags["--endpoint"]) == ("0.0.0.0", port), f"{host} binds {flags['--endpoint']}"
        assert str(port) in services[host]["expose"]
        assert load_config(ROOT / "configs" / flags["--config"].removeprefix(CONFIGS_IN_CONTAINER)) == config


def test_gateway_port_healthcheck_and_prometheus_target_agree():
    gateway = load_compose()["services"]["gateway"]
    _, flags = module_and_flags(gateway["command"])
    port = flags["--port"]
    assert [p.split(":")[-1] for p in gateway["ports"]] == [port]
    assert f"127.0.0.1:{port}/readyz" in " ".join(gateway["healthcheck"]["test"])
    prometheus = yaml.safe_load((ROOT / "configs/prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == [f"gateway:{port}"]
    assert prometheus["scrape_configs"][0]["metrics_path"] == "/metrics"


def test_k8s_workers_gateway_probes_and_images():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    workers = docs[("StatefulSet", "boundserve-worker")]
    assert docs[("Service", "boundserve-worker")]["spec"]["clusterIP"] == "None"  # stable pod DNS names
    config = load_config(ROOT / "configs/k8s.toml")
    service = docs[("Service", "boundserve-worker")]  # the gateways find the workers by its name: any count
    assert (config.worker.discovery, config.worker.service) == ("dns", service["metadata"]["name"])
    assert config.worker.service_port in [p["port"] for p in service["spec"]["ports"]]
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1  # one worker per GPU
    assert module_and_flags(worker["command"])[1]["--endpoint"] == "tcp://0.0.0.0:5555"
    gateway_spec = docs[("Deployment", "boundserve-gateway")]["spec"]
    assert gateway_spec["replicas"] >= 2
    (gateway,) = gateway_spec["template"]["spec"]["containers"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port = int(module_and_flags(gateway["command"])[1]["--port"])
    assert gateway["ports"][0]["containerPort"] == port
    compose = load_compose()["services"]
    assert gateway["image"] == compose["gateway"]["image"] and worker["image"] == compose["worker-gpu0"]["image"]
