"""One Compose project driven by a check: a unique name, its own variables, and its own cleanup.

Works the same with the v2 plugin (`docker compose`) and Debian's v1 (`docker-compose`): only
commands and flags both share are used (profiles are named one by one; v1 has no `--profile '*'`).
Everything the project creates carries the label com.docker.compose.project=<name>, which is how
`leftovers()` proves that `down` removed it all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from deploy.steps import StepFailed, Steps

RUN_TIMEOUT_S = 3600.0  # a one-off service (the CPU compile takes minutes on 2 cores)
UP_TIMEOUT_S = 600.0
DOWN_TIMEOUT_S = 300.0
QUERY_TIMEOUT_S = 60.0
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


@dataclass(frozen=True)
class Container:
    service: str
    state: str  # running, exited, restarting ...
    health: str  # healthy, unhealthy, starting, or "" without a health check


class ComposeProject:
    """`compose` is the client argv; `env` holds the compose file's variables for this run."""

    def __init__(self, steps: Steps, compose: tuple[str, ...], docker: str, file: Path, name: str,
                 env: dict[str, str], profiles: list[str]) -> None:
        self.steps = steps
        self.docker = docker
        self.name = name
        self.env = env
        self.profiles = profiles  # every profile the file declares: `down` and `config` see all services
        self._base = [*compose, "-f", str(file), "-p", name]

    def _argv(self, profiles: list[str], *args: str) -> list[str]:
        return [*self._base, *(flag for p in profiles for flag in ("--profile", p)), *args]

    def validate(self) -> None:
        self.steps.run(self._argv(self.profiles, "config", "-q"), timeout_s=QUERY_TIMEOUT_S, env=self.env)

    def resolved(self) -> dict:
        """The file as Compose reads it with this run's variables (every profile's services)."""
        text = self.steps.output(self._argv(self.profiles, "config"), timeout_s=QUERY_TIMEOUT_S, env=self.env)
        return yaml.safe_load(text)

    def run_once(self, service: str, profile: str) -> None:
        """`run --rm` a one-off service (no TTY) and fail unless it exits 0."""
        self.steps.run(self._argv([profile], "run", "--rm", "-T", service), timeout_s=RUN_TIMEOUT_S, env=self.env)

    def up(self, profiles: list[str], services: list[str] | None = None) -> None:
        """`up -d` the profiles' services (only `services`, when given)."""
        self.steps.run(self._argv(profiles, "up", "-d", "--no-build", *(services or [])), timeout_s=UP_TIMEOUT_S,
                       env=self.env)

    def down(self) -> None:
        self.steps.run(self._argv(self.profiles, "down", "--volumes", "--remove-orphans"),
                       timeout_s=DOWN_TIMEOUT_S, env=self.env)

    def logs(self, tail_lines: int = 30) -> str:
        """The last lines each service printed (for a failure message)."""
        argv = self._argv(self.profiles, "logs", "--no-color", "--tail", str(tail_lines))
        returncode, stdout, stderr = self.steps.capture(argv, timeout_s=QUERY_TIMEOUT_S, env=self.env)
        return stdout + stderr if returncode == 0 else f"(compose logs failed: {stderr.strip()})"

    def containers(self) -> list[Container]:
        fmt = '{{index .Config.Labels "' + SERVICE_LABEL + '"}}|{{.State.Status}}|{{if .State.Health}}{{.State.Health.Status}}{{end}}'
        ids = self._ids("ps", "-a", "-q")
        if not ids:
            return []
        text = self.steps.output([self.docker, "inspect", "--format", fmt, *ids], timeout_s=QUERY_TIMEOUT_S)
        return [Container(*line.split("|")) for line in text.splitlines() if line]

    def _ids(self, *command: str) -> list[str]:
        argv = [self.docker, *command, "--filter", f"label={PROJECT_LABEL}={self.name}"]
        return self.steps.output(argv, timeout_s=QUERY_TIMEOUT_S).split()

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project still on the daemon ("kind id" each)."""
        found = [f"container {i}" for i in self._ids("ps", "-a", "-q")]
        found += [f"network {i}" for i in self._ids("network", "ls", "-q")]
        found += [f"volume {i}" for i in self._ids("volume", "ls", "-q")]
        return found

    def require_running(self, services: list[str]) -> list[Container]:
        """The containers now; StepFailed naming any of `services` that exited or keeps restarting."""
        now = self.containers()
        states = {c.service: c.state for c in now}
        dead = [f"{s} ({states.get(s, 'missing')})" for s in services if states.get(s) != "running"]
        if dead:
            raise StepFailed(f"not running: {', '.join(dead)}; the services' last lines:\n{self.logs()}")
        return now
