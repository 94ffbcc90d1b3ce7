"""This machine's Docker side: the Debian packages, a daemon, and the clients a check drives.

Builds need BuildKit (the Dockerfiles mount docker/wheels and a pip.conf secret): a client with the
buildx plugin, or a pre-23 client (Debian's docker.io 20.10) with DOCKER_BUILDKIT=1; a Docker 23+
client without buildx can only use the legacy builder, which cannot. Compose is the v2 plugin
(`docker compose`) when it answers, else Debian's v1 (`docker-compose`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.steps import Step, StepFailed, Steps

DEBIAN_DOCKER = "/usr/bin/docker"  # the client of Debian's docker.io package
APT_TIMEOUT_S = 900.0
DAEMON_START_TIMEOUT_S = 90.0
DAEMON_STOP_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Clients:
    """How to talk to Docker: `docker` for queries and runs, `build` (+ `build_env`) for BuildKit builds."""

    docker: str
    build: tuple[str, ...]
    build_env: dict[str, str]
    compose: tuple[str, ...]

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.build_env.items())
        return f"build: {env + ' ' if env else ''}{' '.join(self.build)}; compose: {' '.join(self.compose)}"


def answers(argv: list[str], timeout_s: float = QUERY_TIMEOUT_S) -> bool:
    """True when argv runs and exits 0 (a missing program or a timeout is False)."""
    if shutil.which(argv[0]) is None:
        return False
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_compose() -> tuple[str, ...] | None:
    """argv of a Compose client: the v2 plugin, else v1; None when neither is installed."""
    for argv in (("docker", "compose"), ("docker-compose",)):
        if answers([*argv, "version"]):
            return argv
    return None


def client_major_version(docker: str) -> int | None:
    """19, 20, 28 ... from `docker --version` ("Docker version 20.10.24+dfsg1, build 297e128")."""
    try:
        text = subprocess.run([docker, "--version"], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"version (\d+)\.", text)
    return int(match.group(1)) if match else None


def find_build_client() -> tuple[str, tuple[str, ...], dict[str, str]] | None:
    """(docker, build argv, build env) of the first client on PATH or Debian's that can build with BuildKit."""
    candidates = [path for path in (shutil.which("docker"), DEBIAN_DOCKER) if path and os.path.exists(path)]
    for docker in dict.fromkeys(candidates):
        if answers([docker, "buildx", "version"]):
            return docker, (docker, "buildx", "build", "--load"), {}
        major = client_major_version(docker)
        if major is not None and major < 23:
            return docker, (docker, "build"), {"DOCKER_BUILDKIT": "1"}
    return None


def missing_packages() -> list[str]:
    """Debian packages to install so that a daemon, a BuildKit client and a Compose client exist."""
    missing = []
    if shutil.which("dockerd") is None or find_build_client() is None:
        missing.append("docker.io")
    if find_compose() is None:
        missing.append("docker-compose")
    return missing


def apt_install(steps: Steps, packages: list[str]) -> None:
    """Install Debian packages (after one `apt-get update`); needs root."""
    if not packages:
        return
    if os.geteuid() != 0:
        raise StepFailed(f"{', '.join(packages)} missing and installing needs root: "
                         f"run as root or `sudo apt-get install {' '.join(packages)}` first")
    lock = ["-o", "DPkg::Lock::Timeout=300"]  # other sessions may hold the dpkg lock for a while
    steps.run(["apt-get", *lock, "update", "-q"], timeout_s=APT_TIMEOUT_S)
    steps.run(["apt-get", *lock, "install", "-y", "-q", *packages], timeout_s=APT_TIMEOUT_S,
              env={"DEBIAN_FRONTEND": "noninteractive"})


def ensure_clients(steps: Steps, step: Step) -> Clients:
    """Install what is missing (idempotent: nothing when all is there), then pick the clients."""
    missing = missing_packages()
    apt_install(steps, missing)
    step.note(f"installed {', '.join(missing)}" if missing else "docker.io and a Compose client already installed")
    found, compose = find_build_client(), find_compose()
    if found is None or compose is None or shutil.which("dockerd") is None:
        raise StepFailed("after installing docker.io and docker-compose, still no BuildKit-capable docker "
                         "client, Compose client or dockerd: check PATH")
    docker, build, build_env = found
    clients = Clients(docker, build, build_env, compose)
    step.note(clients.describe())
    return clients


class Daemon:
    """A dockerd this check started (and so stops); or none, when one already answered."""

    def __init__(self, docker: str) -> None:
        self.docker = docker
        self._process: subprocess.Popen | None = None

    def running(self) -> bool:
        return answers([self.docker, "info"])

    def start(self, log_path: Path) -> None:
        if os.geteuid() != 0:
            raise StepFailed("no Docker daemon answers and starting one needs root")
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + DAEMON_START_TIMEOUT_S
        while not self.running():
            if self._process.poll() is not None:
                raise StepFailed(f"dockerd exited with {self._process.returncode}; see {log_path}")
            if time.monotonic() > end:
                raise StepFailed(f"dockerd did not answer within {DAEMON_START_TIMEOUT_S:.0f} s; see {log_path}")
            time.sleep(0.5)

    @property
    def started_here(self) -> bool:
        return self._process is not None

    def stop(self) -> None:
        """SIGTERM our dockerd (it stops the containerd it started), SIGKILL after the timeout."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=DAEMON_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
