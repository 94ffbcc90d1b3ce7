"""docker-compose.yml is a valid Compose file and has the shape the deployment promises.

Validated against the Compose Specification's JSON schema (tests/deploy/data/, with its source and
license) both as written and after Compose's variable interpolation; with a Compose client on the
machine — the v2 plugin (`docker compose`) or Debian's v1 (`docker-compose`), docs/deployment.md —
its `config` command checks the file as well (that needs no Docker engine and no network). Without
a client those tests skip and say so.
"""

from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest

from deploy.docker_host import find_compose
from tests.deploy.stack import COMPOSE_FILE, ROOT, load_compose, raw_compose

SCHEMA = json.loads((ROOT / "tests/deploy/data/compose_spec.json").read_text())
GPU_ENV = {"BOUNDSERVE_CONFIG": "compose-gpu.toml", "GATEWAY_PORT": "9000", "MODEL_DIR": "/data/qwen3"}


def validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(SCHEMA, default=jsonschema.Draft201909Validator)
    cls.check_schema(SCHEMA)
    return cls(SCHEMA)


@pytest.mark.parametrize("document", ["as-written", "interpolated-defaults", "interpolated-gpu"])
def test_compose_file_validates_against_the_compose_spec(document):
    compose = {"as-written": raw_compose, "interpolated-defaults": load_compose,
               "interpolated-gpu": lambda: load_compose(GPU_ENV)}[document]()
    errors = sorted(validator().iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_schema_rejects_a_broken_compose_file():
    """The check has teeth: an unknown service key and a wrong type are caught."""
    compose = load_compose()
    compose["services"]["gateway"]["helthcheck"] = {}
    compose["services"]["worker-cpu"]["ports"] = "8000:8000"
    messages = [e.message for e in validator().iter_errors(compose)]
    assert any("helthcheck" in m for m in messages) and len(messages) >= 2, messages


def test_services_profiles_and_gpu_reservations():
    services = load_compose()["services"]
    assert {"compile", "compile-cuda", "worker-cpu", "worker-gpu0", "worker-gpu1", "gateway", "prometheus"} <= set(services)
    assert services["compile"]["profiles"] == ["compile"] and "artifacts:/artifacts" in services["compile"]["volumes"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert "profiles" not in services["worker-cpu"] and "profiles" not in services["gateway"]  # `up` = CPU stack
    for index in (0, 1):
        gpu = services[f"worker-gpu{index}"]
        device = gpu["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["device_ids"] == [str(index)] and device["capabilities"] == ["gpu"]
        assert gpu["profiles"] == ["gpu"] and gpu["image"] == "boundserve-cuda:latest"


def test_healthcheck_configs_ports_and_environment():
    raw = raw_compose()["services"]
    services = load_compose()["services"]
    check = " ".join(services["gateway"]["healthcheck"]["test"])
    assert "/readyz" in check
    assert raw["gateway"]["ports"] == ["${GATEWAY_PORT:-8000}:8000"]
    assert load_compose({"GATEWAY_PORT": "9000"})["services"]["gateway"]["ports"] == ["9000:8000"]
    assert "${MODEL_DIR:-./models/demo}:/model:ro" in raw["compile"]["volumes"]
    for name in ("worker-cpu", "worker-gpu0", "worker-gpu1", "gateway", "compile"):
        assert "./configs:/app/configs:ro" in services[name]["volumes"], name


COMPOSE = find_compose()
needs_client = pytest.mark.skipif(
    COMPOSE is None, reason="no Compose client (neither `docker compose` nor `docker-compose`) on this machine; "
                            "docs/deployment.md says how to install one")
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # proves `config` needs no daemon


def compose_config(file, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`config -q` on `file` with every profile active (v1 has no `--profile '*'`: each is named)."""
    profiles = sorted({p for s in raw_compose()["services"].values() for p in s.get("profiles", [])})
    argv = [*COMPOSE, "-f", str(file), *(f for p in profiles for f in ("--profile", p)), "config", "-q"]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **NO_ENGINE, **env})


@needs_client
@pytest.mark.parametrize("env", [{}, GPU_ENV], ids=["defaults", "gpu"])
def test_the_compose_client_accepts_the_file(env):
    result = compose_config(COMPOSE_FILE, env)
    assert result.returncode == 0, f"{' '.join(COMPOSE)} config: {result.stderr}"


@needs_client
def test_the_compose_client_rejects_a_broken_file(tmp_path):
    """The client check has teeth: the same file with a misspelt key fails `config`."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    healthcheck:", "    helthcheck:", 1))
    result = compose_config(broken, {})
    assert result.returncode != 0 and "helthcheck" in result.stdout + result.stderr, result
