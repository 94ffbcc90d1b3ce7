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
    base = re.sub(r"\$\{(\w+)\}", lambda m: global_args(dockerfile)[m.group(1)], chain[0]["base"])
    assert "devel" not in base, f"the final stage must not start from a devel image: {base}"
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


# Where images come from: build arguments, defaulting to the public sources (docs/deployment.md).
PIP_MOUNTS = ("--mount=type=bind,source=docker/wheels,target=/wheels",
              "--mount=type=secret,id=pip.conf,target=/etc/pip.conf")
PIP_ARGS = {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_NO_INDEX", "TORCH_INDEX_URL"}


def global_args(path: str) -> dict[str, str | None]:
    """ARG lines before the first FROM: {name: default or None}."""
    found: dict[str, str | None] = {}
    for line in (ROOT / path).read_text().splitlines():
        if re.match(r"FROM\s", line, re.IGNORECASE):
            break
        match = re.match(r"ARG\s+(\w+)(?:=(\S*))?", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def stage_args(stage: dict) -> set[str]:
    return {line.split()[1].split("=")[0] for line in stage["lines"] if line.upper().startswith("ARG ")}


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_images_are_build_arguments_with_public_defaults(dockerfile):
    found, defaults = stages(dockerfile), global_args(dockerfile)
    names = {s["name"] for s in found}
    assert "BASE_IMAGE" in defaults
    for stage in found:
        if stage["base"] in names:
            continue  # built on an earlier stage
        match = re.fullmatch(r"\$\{(\w+)\}", stage["base"])
        assert match, f"{dockerfile}: stage {stage['name']} starts FROM a fixed image {stage['base']}"
        default = defaults.get(match.group(1))
        assert default and ":" in default and "local" not in default, f"{match.group(1)} defaults to {default!r}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_no_syntax_directive_so_building_pulls_only_the_base_image(dockerfile):
    first = (ROOT / dockerfile).read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.IGNORECASE), "a `# syntax=` line pulls a frontend image"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_pip_install_reads_the_wheels_folder_and_the_pip_conf_secret(dockerfile):
    installs = 0
    for stage in stages(dockerfile):
        for line in stage["lines"]:
            if line.upper().startswith("RUN") and "pip install" in line:
                installs += 1
                assert all(mount in line for mount in PIP_MOUNTS), f"{dockerfile}: {line}"
                assert PIP_ARGS <= stage_args(stage), f"{dockerfile}: stage {stage['name']} lacks {PIP_ARGS - stage_args(stage)}"
                assert any("PIP_FIND_LINKS=/wheels" in l for l in stage["lines"] if l.startswith("ENV"))
    assert installs == 2  # torch first (pinned to a variant), then the project


def test_the_wheels_folder_exists_and_reaches_the_build():
    assert (ROOT / "docker/wheels/README.md").is_file()  # tracked: the bind mount source always exists
    for dockerfile in DOCKERFILES:
        patterns = [p.strip() for p in (ROOT / f"{dockerfile}.dockerignore").read_text().splitlines()
                    if p.strip() and not p.startswith("#")]
        assert not ignored("docker/wheels", patterns), f"{dockerfile}.dockerignore keeps docker/wheels out"


def test_torch_is_pinned_to_a_variant_matching_the_project_pin():
    pin = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    cpu = (ROOT / "docker/Dockerfile.cpu").read_text()
    assert f'"torch=={pin}+cpu"' in cpu, "the CPU image must pin the +cpu build: a bare pin can pull CUDA"
    assert "torch.version.cuda is None" in cpu
    cuda = (ROOT / "docker/Dockerfile.cuda").read_text()
    assert f'"torch=={pin}+${{TORCH_VARIANT}}"' in cuda
    variant = re.search(r"ARG TORCH_VARIANT=(\S+)", cuda).group(1)
    assert variant.startswith("cu"), variant


def test_every_pulled_image_has_a_local_fallback():
    """`make compose-check` swaps in docker/fallback/Dockerfile.<service> where a public image cannot be pulled."""
    from deploy.images import pulled_images
    from tests.deploy.stack import raw_compose

    pulled = pulled_images(raw_compose(), load_compose())
    assert {p.service for p in pulled} >= {"prometheus"}
    for image in pulled:
        assert image.variable, f"{image.service}: name the image as ${{VARIABLE:-{image.image}}}"
        path = f"docker/fallback/Dockerfile.{image.service}"
        assert (ROOT / path).is_file(), f"no {path}"
        assert "BASE_IMAGE" in global_args(path)
        users = [line.split()[1] for s in stages(path) for line in s["lines"] if line.upper().startswith("USER ")]
        assert users and users[-1] not in ("root", "0"), f"{path} must run as a non-root user"


def test_the_images_install_every_source_file_the_build_reads():
    """The images `pip install .` a copy without git metadata, where setuptools packages only Python
    files and what `package-data` names: worker/runtime/kernels' C++ sources, which the compile step builds
    into the artifacts, must be named (seen: a wheel built from such a copy left them out)."""
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-data", {})
    sources = sorted(p for package in ("compile", "worker", "shared") for pattern in ("*.cpp", "*.h")
                     for p in (ROOT / package).rglob(pattern))
    assert sources, "worker/runtime/kernels has C++ sources"
    for path in sources:
        package, relative = path.relative_to(ROOT).parts[0], path.relative_to(ROOT / path.relative_to(ROOT).parts[0])
        assert any(fnmatch.fnmatch(relative.as_posix(), p) for p in patterns.get(package, [])), \
            f"{path.relative_to(ROOT)}: not in package-data"
