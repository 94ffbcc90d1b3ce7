"""Helpers for the deployment tests: the compose file read as Compose would, commands, processes.

`load_compose` interpolates `${VAR:-default}` / `${VAR-default}` / `${VAR}` / `$$` the way Docker
Compose does before it validates and runs the file; `module_argv` turns a container command into the
argv that runs the same thing outside a container.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from loadgen.processes import spawn

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S_DIR = ROOT / "deploy" / "k8s"
K8S_BASE = K8S_DIR / "base"  # every object; deploy/k8s and its autoscaling variants apply it
CONFIGS_IN_CONTAINER = "/app/configs/"
_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})")


def interpolate(value, env: dict[str, str]):
    """Compose's variable substitution applied to every string of a loaded YAML tree."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match.group("name"), match.group("op"), match.group("default")
        got = env.get(name)
        if op == ":-" and not got:
            return default
        if op == "-" and got is None:
            return default
        return got or ""

    return _VARIABLE.sub(substitute, value)


def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def load_compose(env: dict[str, str] | None = None) -> dict:
    """The compose file after interpolation with `env` (default: every variable unset)."""
    return interpolate(raw_compose(), env or {})


def k8s_documents() -> list[dict]:
    """The objects of deploy/k8s/base as written (tests/deploy/kustomize.py renders them as applied)."""
    docs = []
    for path in sorted(K8S_BASE.glob("*.yaml")):
        if path.name != "kustomization.yaml":  # kustomize's own file, not a Kubernetes object
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def k8s_containers() -> list[dict]:
    """Every container spec of every workload (Deployment, StatefulSet, Job) in deploy/k8s."""
    found = []
    for doc in k8s_documents():
        if doc.get("kind") in ("Deployment", "StatefulSet", "Job"):
            found.extend(doc["spec"]["template"]["spec"]["containers"])
    return found


def module_and_flags(command: list[str]) -> tuple[str, dict[str, str | None]]:
    """["python", "-m", "worker", "--config", "x", "--debug"] -> ("worker", {"--config": "x", "--debug": None})."""
    assert command[:2] == ["python", "-m"], f"not a `python -m` command: {command}"
    module, rest = command[2], command[3:]
    flags: dict[str, str | None] = {}
    for i, token in enumerate(rest):
        if token.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            flags[token] = None if nxt is None or nxt.startswith("--") else nxt
        else:
            assert i > 0 and rest[i - 1].startswith("--"), f"stray argument {token!r} in {command}"
    return module, flags


def module_argv(command: list[str], replace: dict[str, str]) -> list[str]:
    """The container command as a local argv: this interpreter, with values swapped through `replace`."""
    return [sys.executable] + [replace.get(token, token) for token in command[1:]]


def start(argv: list[str], log_path: Path) -> subprocess.Popen:
    """A child process in the repository root, stdout and stderr to log_path (loadgen/processes.spawn;
    not a session of its own: `stop` signals it alone, as an orchestrator signals one container)."""
    return spawn(argv, log_path, cwd=ROOT, group=False)
