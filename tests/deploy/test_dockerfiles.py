"""The Dockerfiles, read without a Docker engine: multi-stage, non-root, lean final stage, real paths.

Checks what a build would trip over first: every COPY source exists and is let through the
Dockerfile's .dockerignore, every compose `build.target` names a stage, the final (default) stage
runs as the non-root user and installs neither compilers nor Python packages.
"""

from __future__ import annotations

import fnmatch
import re

import pytest

from tests.deploy.stack import ROOT, load_compose

DOCKERFILES = ["docker/Dockerfile.cpu", "docker/Dockerfile.cuda"]


def stages(path: str) -> list[dict]:
    """[{name, base, lines}] in order; continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / path).read_text())
    found: list[dict] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            found.append({"base": match.group(1), "name": match.group(2), "lines": []})
        elif found:
            found[-1]["lines"].append(line)
    return found


def copy_sources(stage: dict) -> list[str]:
    sources = []
    for line in stage["lines"]:
        parts = line.split()
        if parts[0].upper() == "COPY" and not any(p.startswith("--from") for p in parts):
            sources.extend(p for p in parts[1:-1] if not p.startswith("--"))
    return sources


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern decides (`!` re-includes)."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            verdict = not negate
    return verdict


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_multi_stage_with_a_lean_non_root_final_stage(dockerfile):
    found = stages(dockerfile)
    assert len(found) >= 3 and found[-1]["name"] == "runtime", [s["name"] for s in found]
    chain = lineage(found, found[-1])  # the final stage and the stages it is built FROM
    users = [line for line in chain[-1]["lines"] if line.upper().startswith("USER ")]
    assert users and users[-1].split()[1] not in ("root", "0"), "the final stage must run as a non-root user"
    body = " ".join(line for stage in chain for line in stage["lines"])
    assert not re.search(r"(?<![\w-])(g\+\+|gcc|clang|build-essential|pip install)(?![\w])", body), "compilers or pip in the final stage"
    assert "devel" not in chain[0]["base"], "the final stage must not start from a devel image"
    assert "--from=build" in body, "the final stage takes the venv from `build`"


def lineage(found: list[dict], stage: dict) -> list[dict]:
    """Root-first list of stages `stage` is built on (FROM another stage's name), itself last."""
    by_name = {s["name"]: s for s in found if s["name"]}
    chain = [stage]
    while chain[0]["base"] in by_name:
        chain.insert(0, by_name[chain[0]["base"]])
    return chain


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copy_sources_exist_and_pass_the_dockerignore(dockerfile):
    patterns = [p.strip() for p in (ROOT / f"{dockerfile}.dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for stage in stages(dockerfile):
        for source in copy_sources(stage):
            assert (ROOT / source).exists(), f"{dockerfile}: COPY {source} does not exist"
            assert not ignored(source.rstrip("/"), patterns), f"{dockerfile}: COPY {source} is excluded by the dockerignore"


def test_compose_build_targets_name_stages():
    for name, service in load_compose()["services"].items():
        build = service.get("build")
        if build:
            names = [s["name"] for s in stages(build["dockerfile"])]
            assert build["target"] in names, f"{name}: target {build['target']} not in {names}"
