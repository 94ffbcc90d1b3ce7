"""The images a compose file needs, and how this machine gets each one: pulled, built, or stood in for.

Read from the compose file itself, so a new service needs no change here: every `build:` section is
an image to build (grouped by tag); every other service pulls a public image, which it must name as
`${VARIABLE:-default}` so that a locally built image from docker/fallback/Dockerfile.<service> can
take its place where the registry is out of reach. Services that reserve a GPU cannot run on a
machine without one: their images are built as stand-ins (every step of their Dockerfile, with the
CUDA base images and the CUDA torch wheel swapped for the CPU ones) under the tag `standin`.
"""

from __future__ import annotations

import platform
import re
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from deploy.steps import Step, StepFailed, Steps

PUBLIC_BASE_IMAGE = "python:3.11-slim"
LOCAL_BASE_IMAGE = "boundserve-local/python:3.11-bookworm"
IMAGE_PYTHON = (3, 11)  # python:3.11-slim and Debian bookworm's python3 alike
DEBIAN_SUITE = "bookworm"
# What python:3.11-slim offers the Dockerfiles: `python`, venv, headers, CA certificates, useradd.
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-dev", "python-is-python3", "ca-certificates", "passwd")
TORCH_CPU = "torch==2.13.0+cpu"
WHEELS_DIR = "docker/wheels"
FALLBACK_DIR = "docker/fallback"
FALLBACK_TAG = "boundserve-fallback/{service}:local"
STANDIN_TAG = "standin"
PULL_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 3600.0
DEBOOTSTRAP_TIMEOUT_S = 1800.0
_IMAGE_VARIABLE = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):?-(?P<default>[^}]+)\}$")
_PORT_VARIABLE = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):?-\d+\}:(?P<container>\d+)$")


@dataclass(frozen=True)
class Build:
    """One image the compose file builds, and the services that run it."""

    image: str
    context: str
    dockerfile: str
    target: str | None
    services: tuple[str, ...]
    gpu: bool  # every service running it reserves a GPU: built as a stand-in here

    @property
    def tag(self) -> str:
        return f"{self.image.rsplit(':', 1)[0]}:{STANDIN_TAG}" if self.gpu else self.image


@dataclass(frozen=True)
class Pulled:
    """A service that runs a public image; `variable` is what names it in the compose file."""

    service: str
    image: str
    variable: str | None


def reserves_gpu(service: dict) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return any("gpu" in device.get("capabilities", []) for device in devices)


def planned_builds(resolved: dict) -> list[Build]:
    """Images to build, from a compose file as `compose config` prints it (absolute contexts)."""
    by_image: dict[str, list[tuple[str, dict]]] = {}
    for name, service in sorted(resolved["services"].items()):
        if "build" in service:
            if "image" not in service:
                raise ValueError(f"service {name} builds an image without naming it: add `image:`")
            by_image.setdefault(service["image"], []).append((name, service))
    builds = []
    for image, users in by_image.items():
        recipes = {(s["build"]["context"], s["build"].get("dockerfile", "Dockerfile"), s["build"].get("target"))
                   for _, s in users}
        if len(recipes) > 1:
            raise ValueError(f"services {', '.join(n for n, _ in users)} tag different builds as {image}")
        context, dockerfile, target = recipes.pop()
        builds.append(Build(image, context, dockerfile, target, tuple(n for n, _ in users),
                            all(reserves_gpu(s) for _, s in users)))
    return builds


def pulled_images(raw: dict, resolved: dict) -> list[Pulled]:
    """Services without a build: their resolved image, and the variable the raw file names it with."""
    found = []
    for name, service in sorted(resolved["services"].items()):
        if "build" not in service:
            match = _IMAGE_VARIABLE.match(str(raw["services"][name].get("image", "")))
            found.append(Pulled(name, service["image"], match.group("name") if match else None))
    return found


def port_variables(raw: dict) -> dict[str, tuple[str, int]]:
    """{variable: (service, container port)} for every published port written `${VAR:-8000}:8000`."""
    found = {}
    for name, service in raw["services"].items():
        for mapping in service.get("ports", []):
            match = _PORT_VARIABLE.match(str(mapping))
            if match is None:
                raise ValueError(f"service {name} publishes {mapping!r}: write `${{NAME_PORT:-host}}:container` "
                                 "so that a check can pick a free host port")
            found[match.group("name")] = (name, int(match.group("container")))
    return found


def build_args(base_image: str, sources: str, gpu_standin: bool) -> dict[str, str]:
    """Build arguments: where the base image and the Python packages come from (docs/deployment.md)."""
    args = {"BASE_IMAGE": base_image}
    if sources == "wheels":  # docker/wheels is pip's only source
        args |= {"PIP_NO_INDEX": "1", "TORCH_INDEX_URL": ""}
    if gpu_standin:  # Dockerfile.cuda's CUDA-only inputs, swapped for what this machine has
        args |= {"DEVEL_IMAGE": base_image, "TORCH_VARIANT": "cpu"}
    return args


def build_argv(build_cmd: tuple[str, ...], dockerfile: Path, target: str | None, tag: str, args: dict[str, str],
               context: Path, pip_conf: Path | None) -> list[str]:
    argv = [*build_cmd, "--progress=plain", "-f", str(dockerfile), "-t", tag]
    if target:
        argv += ["--target", target]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if pip_conf is not None:
        argv += ["--secret", f"id=pip.conf,src={pip_conf}"]
    return argv + [str(context)]


class Images:
    """Gets images onto the daemon for one check run (`docker` is the client path)."""

    def __init__(self, steps: Steps, docker: str, build_cmd: tuple[str, ...], build_env: dict[str, str],
                 root: Path) -> None:
        self.steps = steps
        self.docker = docker
        self.build_cmd = build_cmd
        self.build_env = build_env
        self.root = root

    def present(self, image: str) -> bool:
        return self.steps.run([self.docker, "image", "inspect", image], timeout_s=60, check=False,
                              echo=False).returncode == 0

    def pull(self, image: str) -> bool:
        return self.steps.run([self.docker, "pull", image], timeout_s=PULL_TIMEOUT_S, check=False).returncode == 0

    def present_or_pulled(self, image: str, step: Step) -> bool:
        if self.present(image):
            step.note(f"{image}: already on the daemon")
            return True
        if self.pull(image):
            step.note(f"{image}: pulled")
            return True
        step.note(f"{image}: cannot be pulled (see {step.log_path})")
        return False

    def base_image(self, step: Step, requested: str | None, debian_sources: list[str]) -> str:
        """The requested image; else python:3.11-slim if it can be had; else a local Debian build."""
        if requested:
            if not self.present_or_pulled(requested, step):
                raise StepFailed(f"--base-image {requested} is neither on the daemon nor pullable")
            return requested
        if self.present_or_pulled(PUBLIC_BASE_IMAGE, step):
            return PUBLIC_BASE_IMAGE
        if self.present(LOCAL_BASE_IMAGE):
            step.note(f"{LOCAL_BASE_IMAGE}: built by an earlier run, reused (docker rmi it to rebuild)")
            return LOCAL_BASE_IMAGE
        self.build_debian_base(step, debian_sources)
        return LOCAL_BASE_IMAGE

    def build_debian_base(self, step: Step, debian_sources: list[str]) -> None:
        """Debian bookworm + its python3 as a root file system (mmdebstrap), imported as an image."""
        from deploy.docker_host import apt_install  # only this path needs mmdebstrap

        if shutil.which("mmdebstrap") is None:
            apt_install(self.steps, ["mmdebstrap"])
            step.note("installed mmdebstrap")
        with tempfile.TemporaryDirectory(prefix="boundserve-base-") as scratch:
            tarball = Path(scratch) / "rootfs.tar"
            excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")]
            self.steps.run(["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
                            f"--include={','.join(DEBIAN_PACKAGES)}", *excludes, DEBIAN_SUITE, str(tarball),
                            *debian_sources], timeout_s=DEBOOTSTRAP_TIMEOUT_S)
            self.steps.run([self.docker, "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python"]',
                            str(tarball), LOCAL_BASE_IMAGE], timeout_s=600)
        step.note(f"{LOCAL_BASE_IMAGE}: built from Debian {DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)})")

    def fill_wheelhouse(self, step: Step) -> None:
        """docker/wheels <- every wheel the images install, fetched by this machine's pip and its config."""
        project = tomllib.loads((self.root / "pyproject.toml").read_text())
        requirements = [TORCH_CPU, *project["build-system"]["requires"], *project["project"]["dependencies"]]
        self.steps.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(self.root / WHEELS_DIR),
                        *wheel_target_flags(), *requirements], timeout_s=BUILD_TIMEOUT_S)
        wheels = sorted((self.root / WHEELS_DIR).glob("*.whl"))
        step.note(f"{len(wheels)} wheels in {WHEELS_DIR} ({sum(w.stat().st_size for w in wheels) / 2**20:.0f} MiB)")

    def build(self, build: Build, args: dict[str, str], pip_conf: Path | None) -> None:
        context = Path(build.context)
        argv = build_argv(self.build_cmd, context / build.dockerfile, build.target, build.tag, args, context, pip_conf)
        self.steps.run(argv, timeout_s=BUILD_TIMEOUT_S, env=self.build_env)

    def smoke(self, build: Build, commands: list[list[str]], step: Step) -> None:
        """Run each service's module with --help in the built image: its venv and sources work there."""
        for command in commands:
            argv = [*command[:3], "--help"]  # ["python", "-m", MODULE]
            self.steps.run([self.docker, "run", "--rm", build.tag, *argv], timeout_s=300)
            step.note(f"{build.tag}: `{' '.join(argv)}` runs")

    def fallback(self, pulled: Pulled, base_image: str, step: Step) -> str:
        """Build docker/fallback/Dockerfile.<service>; returns its tag."""
        dockerfile = self.root / FALLBACK_DIR / f"Dockerfile.{pulled.service}"
        if pulled.variable is None:
            raise StepFailed(f"service {pulled.service} names its image literally ({pulled.image}): write "
                             f"`image: ${{{pulled.service.upper().replace('-', '_')}_IMAGE:-{pulled.image}}}` "
                             "so that a local build can stand in")
        if not dockerfile.is_file():
            raise StepFailed(f"{pulled.image} cannot be pulled and there is no {dockerfile.relative_to(self.root)} "
                             f"to build a stand-in for service {pulled.service}")
        tag = FALLBACK_TAG.format(service=pulled.service)
        argv = build_argv(self.build_cmd, dockerfile, None, tag, {"BASE_IMAGE": base_image}, dockerfile.parent, None)
        self.steps.run(argv, timeout_s=BUILD_TIMEOUT_S, env=self.build_env)
        step.note(f"{pulled.service}: {tag} built from {dockerfile.relative_to(self.root)}; {pulled.variable}={tag}")
        return tag


def wheel_target_flags() -> list[str]:
    """pip download flags for the images' interpreter (CPython 3.11, glibc 2.36) whatever runs the check."""
    arch = platform.machine()
    major, minor = IMAGE_PYTHON
    # pip matches --platform tags exactly: name glibc 2.36 (bookworm) down to 2.17; wheels for older
    # glibc carry the legacy aliases too (manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5).
    manylinux = [f"manylinux_2_{glibc}_{arch}" for glibc in range(36, 16, -1)]
    legacy = [f"manylinux{name}_{arch}" for name in ("2014", "2010", "1")]
    platforms = [flag for tag in manylinux + legacy for flag in ("--platform", tag)]
    return ["--only-binary=:all:", "--python-version", f"{major}.{minor}", "--implementation", "cp",
            "--abi", f"cp{major}{minor}", *platforms]
