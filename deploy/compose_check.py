"""`python -m deploy.compose_check` (`make compose-check`): build and run docker-compose.yml for real.

On this machine, as a new user would: install Docker and a Compose client from Debian if missing,
start a daemon if none answers, get a base image (python:3.11-slim, or one built from Debian's
python3 where Docker Hub is out of reach) and the Python wheels (from this machine's pip), build
every image the compose file names (the GPU ones as CPU stand-ins), run `demo-model` and `compile`,
bring up the gateway, the CPU worker and Prometheus (from Debian's package where its image cannot be
pulled), send /v1/score and /v1/generate through the published port, check that Prometheus scraped
the gateway, and `down` with nothing of the project left. Every step prints its commands and time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from deploy import probes
from deploy.compose_project import ComposeProject
from deploy.docker_host import Clients, Daemon, ensure_clients
from deploy.images import Images, build_args, planned_builds, port_variables, pulled_images
from deploy.steps import StepFailed, Steps
from loadgen.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
LOG_DIR = ROOT / "build" / "compose-check"
UP_PROFILES = ["monitoring"]  # besides the default services: what runs on a CPU-only machine
ONE_OFF = [("demo-model", "demo"), ("compile", "compile")]  # (service, profile), run in this order
GATEWAY, PROMETHEUS = ("gateway", 8000), ("prometheus", 9090)  # (service, container port)
OPTIONAL = {"grafana": "the overload dashboard (configs/grafana/) for people; nothing this check asserts reads it"}
"""Services left out of `up`, said so in the result, when their image can be neither pulled nor built."""
READY_TIMEOUT_S = 300.0  # the worker warms up and profiles before the gateway is ready
SCRAPE_TIMEOUT_S = 120.0  # scrape_interval is 5 s; rules are evaluated every 15 s
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.compose_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", choices=["wheels", "public"], default="wheels",
                        help="wheels: fill docker/wheels with this machine's pip and build with PIP_NO_INDEX=1 "
                             "(default); public: the Dockerfiles' default indexes (PyPI, the PyTorch CPU index)")
    parser.add_argument("--pip-conf", type=Path, help="a pip.conf passed to every build as the secret `pip.conf`")
    parser.add_argument("--base-image", help="Python 3.11 base image to build on (default: python:3.11-slim "
                                             "if it can be pulled, else one built from Debian packages)")
    parser.add_argument("--debian-mirror", default=DEBIAN_MIRROR, help="for the Debian-built base image")
    parser.add_argument("--debian-security-mirror", default=DEBIAN_SECURITY_MIRROR)
    parser.add_argument("--skip-gpu-images", action="store_true", help="do not build the GPU services' stand-ins")
    parser.add_argument("--keep-daemon", action="store_true", help="leave running a dockerd this check started")
    args = parser.parse_args(argv)
    if args.pip_conf is not None and not args.pip_conf.is_file():
        parser.error(f"--pip-conf {args.pip_conf}: no such file")
    return args



def compose_variables(raw_text: str, raw: dict, models_dir: Path) -> dict[str, str]:
    """Every variable the compose file reads: free host ports, the scratch models folder, and empty
    (so the file's own default applies, whatever this shell has exported) for all the others."""
    env = dict.fromkeys(_VARIABLE.findall(raw_text), "")
    env |= {name: str(free_port()) for name in port_variables(raw)}
    env |= {"MODELS_DIR": str(models_dir), "MODEL_DIR": str(models_dir / "demo")}
    return env


def url_of(raw: dict, env: dict[str, str], service: str, container_port: int) -> str:
    for name, (owner, port) in port_variables(raw).items():
        if (owner, port) == (service, container_port):
            return f"http://127.0.0.1:{env[name]}"
    raise ValueError(f"docker-compose.yml publishes no port {container_port} of service {service}")


def running_services(resolved: dict, profiles: list[str]) -> list[str]:
    """Services `up` starts with these profiles: those without a profile, and those in one of them."""
    return sorted(name for name, service in resolved["services"].items()
                  if not service.get("profiles") or set(service["profiles"]) & set(profiles))


class ComposeCheck:
    """The whole run; `clean_up()` (always called) undoes what `run()` got to."""

    def __init__(self, args: argparse.Namespace, steps: Steps) -> None:
        self.args = args
        self.steps = steps
        self.raw_text = COMPOSE_FILE.read_text()
        self.raw = yaml.safe_load(self.raw_text)
        self.models_dir = Path(tempfile.mkdtemp(prefix="boundserve-check-models-"))
        self.models_dir.chmod(0o777)  # the containers write it as uid 1000
        self.env = compose_variables(self.raw_text, self.raw, self.models_dir)
        self.daemon: Daemon | None = None
        self.project: ComposeProject | None = None
        self.down_done = False
        self.left_out: dict[str, str] = {}
        """Optional services not started: service -> why."""

    def run(self) -> None:
        clients = self._prepare_docker()
        profiles = sorted({p for s in self.raw["services"].values() for p in s.get("profiles", [])})
        self.project = ComposeProject(self.steps, clients.compose, clients.docker, COMPOSE_FILE,
                                      f"boundserve-check-{os.getpid()}", self.env, profiles)
        with self.steps.step("compose file: validated by the client") as step:
            self.project.validate()
            step.note(f"project {self.project.name}; ports " +
                      ", ".join(f"{k}={v}" for k, v in self.env.items() if k.endswith("_PORT")))
        self._images(clients)
        self._serve()
        with self.steps.step("down: nothing of the project left") as step:
            self._down()
            step.note("no container, network or volume of the project remains")

    def _prepare_docker(self) -> Clients:
        with self.steps.step("tools: Docker engine and Compose client") as step:
            clients = ensure_clients(self.steps, step)
        with self.steps.step("Docker daemon") as step:
            self.daemon = Daemon(clients.docker)
            if self.daemon.running():
                step.note("a daemon already answers: used and left running")
            else:
                self.daemon.start(step.log_path)
                step.note("started dockerd" + (" (left running: --keep-daemon)" if self.args.keep_daemon
                                               else " (stopped at the end)"))
        return clients

    def _images(self, clients: Clients) -> None:
        images = Images(self.steps, clients.docker, clients.build, clients.build_env, ROOT)
        resolved = self.project.resolved()
        with self.steps.step("base image") as step:
            sources = [f"deb {self.args.debian_mirror} bookworm main",
                       f"deb {self.args.debian_mirror} bookworm-updates main",
                       f"deb {self.args.debian_security_mirror} bookworm-security main"]
            base = images.base_image(step, self.args.base_image, sources)
        if self.args.sources == "wheels":
            with self.steps.step("wheels: docker/wheels from this machine's pip") as step:
                images.fill_wheelhouse(step)
        for build in planned_builds(resolved):
            if build.gpu and self.args.skip_gpu_images:
                continue
            kind = "GPU stand-in" if build.gpu else "image"
            with self.steps.step(f"build {kind} {build.tag} (for {', '.join(build.services)})") as step:
                images.build(build, build_args(base, self.args.sources, build.gpu), self.args.pip_conf)
                if build.gpu:  # never run by this check otherwise
                    commands = {tuple(resolved["services"][s]["command"][:3]) for s in build.services}
                    images.smoke(build, [list(c) for c in sorted(commands)], step)
        for pulled in pulled_images(self.raw, resolved):
            with self.steps.step(f"image for {pulled.service}") as step:
                if images.present_or_pulled(pulled.image, step):
                    continue
                try:
                    self.env[pulled.variable] = images.fallback(pulled, base, step)
                except StepFailed as exc:
                    if pulled.service not in OPTIONAL:
                        raise
                    self.left_out[pulled.service] = (f"{pulled.image} cannot be pulled and its stand-in could not be "
                                                     f"built: {str(exc).splitlines()[0]}")
                    step.note(f"{pulled.service} will NOT be started ({OPTIONAL[pulled.service]}): "
                              f"{self.left_out[pulled.service]}")

    def _serve(self) -> None:
        for service, profile in ONE_OFF:
            with self.steps.step(f"compose run {service}"):
                self.project.run_once(service, profile)
        resolved = self.project.resolved()
        services = [s for s in running_services(resolved, UP_PROFILES) if s not in self.left_out]
        with self.steps.step(f"compose up: {', '.join(services)}"):
            self.project.up(UP_PROFILES, services if self.left_out else [])
        gateway = url_of(self.raw, self.env, *GATEWAY)
        with self.steps.step("gateway ready and its health check healthy") as step:
            probes.wait_for("the gateway's /readyz and health check", lambda: self._not_ready(gateway, services),
                            READY_TIMEOUT_S)
            step.note(f"{gateway}/readyz 200; containers: " + ", ".join(
                f"{c.service} {c.health or c.state}" for c in self.project.containers()))
        self._requests(gateway)
        self._scraped(url_of(self.raw, self.env, *PROMETHEUS))

    def _not_ready(self, gateway: str, services: list[str]) -> str | None:
        containers = self.project.require_running(services)
        status, body = probes.http_json(gateway + "/readyz", timeout_s=5)
        if status != 200:
            return f"/readyz answered {status} {body}"
        health = {c.service: c.health for c in containers}.get(GATEWAY[0])
        return None if health == "healthy" else f"gateway health check: {health or 'none'}"

    def _requests(self, gateway: str) -> None:
        with self.steps.step("POST /v1/score through the published port") as step:
            status, body = probes.http_json(gateway + "/v1/score", probes.SCORE_BODY)
            problems = probes.score_problems(status, body, len(probes.SCORE_BODY["samples"]),
                                             len(probes.SCORE_BODY["labels"]))
            if problems:
                raise StepFailed("/v1/score: " + "; ".join(problems))
            step.note(f"200, scores {[[round(p, 4) for p in row] for row in body['scores']]}")
        with self.steps.step("POST /v1/generate through the published port") as step:
            status, body = probes.http_json(gateway + "/v1/generate", probes.GENERATE_BODY)
            problems = probes.generate_problems(status, body, probes.GENERATE_BODY["num_return_sequences"],
                                                probes.GENERATE_BODY["max_new_tokens"])
            if problems:
                raise StepFailed("/v1/generate: " + "; ".join(problems))
            step.note("200, candidates " + ", ".join(f"{c['token_ids']} ({c['score']:.3f})" for c in body["candidates"]))

    def _scraped(self, prometheus: str) -> None:
        def not_scraped() -> str | None:
            self.project.require_running([GATEWAY[0], PROMETHEUS[0]])
            up = probes.prometheus_query(prometheus, f'up{{job="{probes.SCRAPE_JOB}"}}')
            counted = probes.prometheus_query(
                prometheus, f'boundserve_requests_total{{job="{probes.SCRAPE_JOB}",outcome="ok"}}')
            status, rules = probes.http_json(prometheus + "/api/v1/rules")
            groups = rules.get("data", {}).get("groups", []) if status == 200 else []
            return probes.scrape_problem(up, counted) or probes.rules_problem(groups)

        with self.steps.step("Prometheus scraped the gateway") as step:
            probes.wait_for("Prometheus scraping the gateway", not_scraped, SCRAPE_TIMEOUT_S)
            step.note(f"{prometheus}: target {probes.SCRAPE_JOB} up, ok requests on {', '.join(probes.ROUTES)} "
                      "counted, recording rules loaded")

    def _down(self) -> None:
        self.project.down()
        self.down_done = True
        left = self.project.leftovers()
        if left:
            raise StepFailed(f"left behind after down: {', '.join(left)}")

    def clean_up(self) -> list[str]:
        """Undo whatever run() got to; returns what could not be undone."""
        problems = []
        if self.project is not None and not self.down_done:
            try:
                with self.steps.step("clean-up: compose down after a failure"):
                    self._down()
            except StepFailed as exc:
                problems.append(str(exc))
        shutil.rmtree(self.models_dir, ignore_errors=True)
        if self.models_dir.exists():
            problems.append(f"could not remove {self.models_dir} (files of uid 1000: remove as root)")
        if self.daemon is not None and self.daemon.started_here and not self.args.keep_daemon:
            with self.steps.step("stop the dockerd this check started"):
                self.daemon.stop()
        return problems


def _stopped(signum: int, frame) -> None:
    raise StepFailed(f"stopped by signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stopped)  # `kill` ends the run like a failure: with the clean-up
    shutil.rmtree(LOG_DIR, ignore_errors=True)
    steps = Steps(LOG_DIR, "compose-check")
    check = ComposeCheck(args, steps)
    failure = None
    try:
        check.run()
    except (StepFailed, TimeoutError, ValueError) as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted (Ctrl-C)"
    finally:
        problems = check.clean_up()
        print(steps.summary())
    for text in filter(None, [failure, *problems]):
        print(f"[compose-check] FAILED: {text}", file=sys.stderr)
    if failure or problems:
        return 1
    print("[compose-check] passed: images built, /v1/score and /v1/generate answered by containers, "
          "metrics scraped, down left nothing behind")
    for service, why in check.left_out.items():
        print(f"[compose-check] NOT started: {service} ({OPTIONAL[service]}): {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
