"""`python -m gateway --config configs/x.toml --artifacts artifacts/x [--spawn-workers]`.

Serves the HTTP API on uvloop; with --spawn-workers it also starts the configured workers and
restarts any that crash or stop answering. Prints the URL and an example request once listening.
SIGTERM or Ctrl-C drains: new requests get 503 draining, queued and in-flight ones are answered
(within drain_timeout_ms, which also waits for the bodies of requests that arrived before the drain), the
listener closes once every handler has answered, then the workers stop. A client still sending its body
when the drain ends is cut off.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from gateway.app import GATEWAY, make_app
from gateway.limits import compiled_bounds
from gateway.logs import gateway_logging
from gateway.wiring import Settings
from gateway.supervisor import Supervisor, WorkerSpec
from gateway.tokenizer import RequestTokenizer
from shared.config import ConfigError, DeploymentConfig, load_config
from shared.manifest import bounds_differences, read_manifest, threads_difference

log = logging.getLogger("gateway")
HANDLER_GRACE_S = 2.0
DRAIN_POLL_S = 0.02


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="deployment TOML")
    parser.add_argument("--artifacts", required=True, help="folder written by `python -m compile`")
    parser.add_argument("--spawn-workers", action="store_true", help="start and supervise the configured workers")
    parser.add_argument("--host", help="listen address (default: gateway.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default: gateway.port)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with gateway_logging():
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; 2 when the start is refused."""
    try:
        config = load_config(args.config)
        gw = dataclasses.replace(config.gateway, host=args.host or config.gateway.host,
                                 port=config.gateway.port if args.port is None else args.port)
        config = config.replace(gateway=gw)
        settings = _settings(config, Path(args.artifacts), args.spawn_workers)
    except (ConfigError, OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    return uvloop.run(_serve(settings, args))


def _settings(config: DeploymentConfig, artifacts: Path, spawn_workers: bool) -> Settings:
    """What the app serves with; refuses to spawn CPU workers that would refuse the artifacts (and be
    restarted over and over), artifacts whose manifest records no bounds, and a config whose [bounds]
    differ from the compiled ones."""
    if spawn_workers and config.worker.discovery != "static":
        raise ConfigError(f'--spawn-workers starts the [worker] endpoints list; with discovery = '
                          f'"{config.worker.discovery}" the workers are found, not started: start them yourself, '
                          "or use the static list")
    manifest = read_manifest(artifacts)
    if spawn_workers and "cpu" in config.worker.devices and (problem := threads_difference(manifest, config)):
        raise ConfigError(f"{artifacts}: {problem}")
    compiled_bounds(manifest)  # ValueError: a manifest that records none
    if differences := bounds_differences(manifest, config):
        raise ConfigError(f"the config's [bounds] differ from what the artifacts in {artifacts} were compiled for: "
                          f"{'; '.join(differences)}; rebuild them (python -m compile), or leave [bounds] out of the "
                          "config to serve the compiled bounds")
    token = None
    if config.gateway.auth_token_env:
        token = os.environ.get(config.gateway.auth_token_env)
        if not token:
            raise ConfigError(f"gateway.auth_token_env names {config.gateway.auth_token_env}, which is not set")
    return Settings(config, manifest, RequestTokenizer.from_artifacts(artifacts), token)


async def _serve(settings: Settings, args: argparse.Namespace) -> int:
    app = make_app(settings)
    # After the drain (which waits for bodies of requests that arrived before it) only handlers of clients still
    # sending past drain_timeout_ms are left: give them a moment, not a minute.
    # handler_cancellation: a client that closes its connection cancels its handler, which takes the request's
    # work out of the queue (gateway/request_end.py) instead of computing an answer nobody reads.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=HANDLER_GRACE_S,
                           handler_cancellation=True)
    await runner.setup()
    gw = settings.config.gateway
    site = web.TCPSite(runner, gw.host, gw.port)
    try:
        await site.start()
    except OSError as exc:  # the port is taken, the address is not this machine's, ...
        log.error("cannot start: cannot listen on %s:%s: %s", gw.host, gw.port, exc.strerror or exc)
        await runner.cleanup()
        return 2
    gateway = app[GATEWAY]
    supervisor = None
    if args.spawn_workers:
        pool = gateway.pool
        supervisor = Supervisor(_worker_specs(settings.config, args), pool.declare_lost, pool.stuck_pid,
                                pool.ready_pid, standby=True)
        supervisor.start()
    port = site._server.sockets[0].getsockname()[1] if site._server else gw.port  # type: ignore[union-attr]
    _announce(settings, gw.host, port, gateway.limits.beam_enabled)
    # what startup built (modules, config, tokenizer, routes) lives as long as the process: frozen out of the
    # collector's view, a full collection walks only what serving allocated, instead of stalling the loop (and
    # every request on it) tens of ms to walk the startup heap too (bench/refusal_time.py measures both)
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("draining: no new requests; answering what is queued and in flight")
    gateway.draining = True
    await _drain(gateway, gw.drain_timeout_ms / 1000.0)
    await runner.cleanup()  # stops listening, waits for every handler to write its answer, stops the pool
    if supervisor is not None:
        await supervisor.stop()  # SIGTERM: each worker drains what it holds and exits 0
    log.info("stopped")
    return 0


async def _drain(gateway, timeout_s: float) -> None:
    """Wait until nothing is queued or in flight (or `timeout_s`); the pool keeps serving meanwhile."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not gateway.idle() and loop.time() < end:
        await asyncio.sleep(DRAIN_POLL_S)
    if not gateway.idle():  # answer the rest now (503) rather than cut their connections later
        log.warning("drain timeout after %.1f s: what is still queued or in flight gets 503", timeout_s)
        await gateway.stop()


def _worker_specs(config: DeploymentConfig, args: argparse.Namespace) -> list[WorkerSpec]:
    return [WorkerSpec(args.config, args.artifacts, endpoint, device, i)
            for i, (endpoint, device) in enumerate(zip(config.worker.endpoints, config.worker.devices))]


def _announce(settings: Settings, host: str, port: int, beam: bool) -> None:
    url = f"http://{host}:{port}"
    auth = ' -H "Authorization: Bearer $TOKEN"' if settings.auth_token else ""
    body = {"samples": ["red running shoe", "blue phone case"], "labels": ["yes", "no"]}
    print(f"boundserve gateway listening on {url}  (readiness: {url}/readyz, API: {url}/openapi.json)", flush=True)
    print(f"try:  curl -s {url}/v1/score -H 'Content-Type: application/json'{auth} -d '{json.dumps(body)}'",
          flush=True)
    if beam:
        beam = {"prompt": "red running", "beam_width": 4, "max_new_tokens": 3, "num_return_sequences": 2}
        print(f"      curl -s {url}/v1/generate -H 'Content-Type: application/json'{auth} -d '{json.dumps(beam)}'",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
