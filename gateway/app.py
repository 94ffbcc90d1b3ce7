"""The aiohttp application factory, used alike by `python -m gateway`, the tests and the benchmarks.

Routes: POST /v1/score, POST /v1/generate, GET /healthz, /readyz, /metrics, /openapi.json; the
de-facto standard ones: POST /v1/rerank, /v2/rerank (Cohere, Jina), /rerank (text-embeddings-inference),
POST /v1/embeddings, POST /v1/completions and GET /v1/models (OpenAI); POST /admin/constraints.
One middleware gives every request its id, checks the bearer token, turns every error into the
JSON of gateway/errors.py and writes one JSON log line per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.api.deadline import budget_ms, header_budget_ms
from gateway.api.priority import resolve_priority
from gateway.errors import ApiError, error_response
from gateway.api.generate import parse_generate
from gateway.api.completions import parse_completions
from gateway.completions import CompletionService
from gateway.api.answers import Health, Ready, WorkerState, encode_json
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.metrics import drop_reason
from gateway.api.openapi import openapi_document
from gateway.api.body import read_body
from gateway.api.score import parse_score
from gateway.api import rerank as rerank_api
from gateway.api.reranking import TRUNCATED_HEADER, rerank, served_model
from gateway.api.embeddings import embed, model_list, parse_embeddings
from gateway.limits import Limits
from gateway.api.constraints import parse_update
from gateway.wiring import Gateway, Settings
from shared.config import GatewayConfig

log = logging.getLogger("gateway.access")
GATEWAY = web.AppKey("gateway", Gateway)
SETTINGS = web.AppKey("settings", Settings)
REQUEST_ID = web.RequestKey("request_id", str)
BODY_READ_AT = web.RequestKey("body_read_at", float)
"""When a work request's body was fully read (time.perf_counter(), s): the start of its time to answer."""
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})
WORK_PATHS_OUTSIDE_V1 = frozenset({"/v2/rerank", "/rerank"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(settings: Settings) -> web.Application:
    """The gateway app; its parts start with the app (cleanup_ctx) and stop with it."""
    # bodies are decompressed by gateway/api/body.py, which answers every failure in JSON
    app = web.Application(middlewares=[frame], client_max_size=settings.config.gateway.max_body_bytes,
                          handler_args={"auto_decompress": False})
    app[SETTINGS] = settings
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_post("/v1/score", score)
    app.router.add_post("/v1/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/rerank", rerank_v1)
    app.router.add_post("/v2/rerank", rerank_v2)
    app.router.add_post("/rerank", rerank_tei)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post("/admin/constraints", admin_constraints)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gateway = Gateway.build(app[SETTINGS])
    app[GATEWAY] = gateway
    await gateway.start()
    yield
    await gateway.stop()


@web.middleware
async def frame(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.monotonic()
    given = request.headers.get("X-Request-Id", "")
    request_id = given if REQUEST_ID_PATTERN.fullmatch(given) else uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    error: ApiError | None = None
    gateway = request.app.get(GATEWAY)
    try:
        _authorize(request)
        response = await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPException as exc:
        error = _http_error(exc)
    except asyncio.CancelledError:  # the client closed its connection, or a drain ended: nothing can be sent
        if gateway is not None:  # a lost connection is the client's doing, even during a drain
            closed = request.transport is None or not gateway.draining
            gone = ApiError("client_closed" if closed else "draining", "the connection closed")
            _account(request, gateway, gone.status, gone, started)
        raise
    except Exception:
        logging.getLogger("gateway").exception("request %s failed", request_id)
        error = ApiError("internal", f"the gateway failed on request {request_id}; see its log")
    if error is not None:
        response = error_response(error, request_id)
        if request.body_exists and not request.content.is_eof():  # answered before its body was read: the rest
            response.force_close()  # would be taken for the next request, or may never come
    response.headers["X-Request-Id"] = request_id
    if gateway is not None:
        body_read_at = request.get(BODY_READ_AT)
        try:
            if body_read_at is not None and await _written(request, response):
                gateway.metrics.observe_body_to_answer(error.code if error else "ok", response.status,
                                                       time.perf_counter() - body_read_at)
        finally:  # counted even when the client's leaving cancels the write
            _account(request, gateway, response.status, error, started)
    return response


async def _written(request: web.Request, response: web.StreamResponse) -> bool:
    """Write the answer here, not after the middleware returns (aiohttp's own prepare and write_eof then do
    nothing), so that the time to it written can be taken; False when the client has gone."""
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        return False
    return True


def _account(request: web.Request, gateway: Gateway, status: int, error: ApiError | None, started: float) -> None:
    elapsed_ms = (time.monotonic() - started) * 1000.0
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
    code = "ok" if error is None else error.code
    work = (request.path.startswith("/v1/") or request.path in WORK_PATHS_OUTSIDE_V1) and request.path != "/v1/models"
    drop = drop_reason(code, error.drop_reason) if work and error is not None else None
    gateway.metrics.count_request(route, code, drop)
    if work:
        gateway.metrics.observe_stage("total", elapsed_ms)
    if gateway.settings.config.gateway.access_log:
        log.info(orjson.dumps({"ts": round(time.time(), 6), "event": "request", "request_id": request[REQUEST_ID],
                               "method": request.method, "path": request.path, "status": status,
                               "code": code, "ms": round(elapsed_ms, 3)}).decode())


def _authorize(request: web.Request) -> None:
    token = request.app[SETTINGS].auth_token
    if token is None and request.path.startswith("/admin/"):
        raise ApiError("forbidden", "admin routes need a bearer token: set gateway.auth_token_env in the config and "
                                    "that variable in the gateway's environment")
    if token is None or request.path in OPEN_PATHS:
        return
    given = request.headers.get("Authorization", "")
    if not given.startswith("Bearer "):
        raise ApiError("unauthorized", "missing bearer token: send the header Authorization: Bearer <token>")
    if not hmac.compare_digest(given[7:].strip().encode(), token.encode()):
        raise ApiError("unauthorized", "the bearer token is not valid for this gateway")


def _http_error(exc: web.HTTPException) -> ApiError:
    if exc.status == 404:
        return ApiError("not_found", "no such route; see GET /openapi.json")
    if exc.status == 405:
        return ApiError("method_not_allowed", "this route does not take that method; see GET /openapi.json")
    if exc.status == 413:
        return ApiError("too_large", f"the request body is over the limit: {exc.text}")
    return ApiError("invalid_request", f"HTTP {exc.status}: {exc.reason}")


async def _read_body(request: web.Request, header_ms: int | None) -> bytes:
    """The body (decoded by its route's types), which must arrive before the request's deadline could
    pass: the smallest deadline its headers give (`header_ms`), else the longest a request may have."""
    gateway = request.app[GATEWAY]
    limit_ms = header_ms if header_ms is not None else gateway.limits.max_deadline_ms
    return await read_body(request, gateway.settings.config.gateway.max_body_bytes, limit_ms)


@contextlib.contextmanager
def _accepting(gateway: Gateway) -> Iterator[float]:
    """The arrival time, once it is clear the gateway takes new work; the request is in progress (a
    drain waits for it) until its handler returns."""
    if gateway.draining:
        raise ApiError("draining", "the gateway is shutting down and takes no new requests; retry on another")
    gateway.requests_in_progress += 1
    try:
        yield gateway.pool.clock()
    finally:
        gateway.requests_in_progress -= 1


def _json(body: object) -> web.Response:
    """An answer (one of gateway/api/types.py's Structs, or the OpenAPI document) as JSON."""
    return web.Response(body=encode_json(body), content_type="application/json")


@dataclass(frozen=True)
class WorkRoute:
    """What a route that runs work on the workers adds to the one handler skeleton (`serve_work`): how
    its body becomes a typed request, its default deadline, and how the request is run."""

    parse: Callable[[bytes, Limits], Any]
    """Body -> the route's typed request (gateway/api/); every refusal an ApiError."""
    default_deadline_ms: Callable[[GatewayConfig], int]
    run: Callable[[Gateway, Any, str, float, int], Awaitable[Any]]
    """(gateway, request, wire id, deadline on the pool's clock, priority) -> the answer Struct."""
    names_answer: Callable[[Any], bool] = lambda spec: True  # noqa: E731
    """Whether the answer carries the request id as `id` (SGLang's schema has no such field)."""


async def serve_work(request: web.Request, route: WorkRoute) -> web.Response:
    """The skeleton of every work route: the arrival (refused while draining), the deadline budget from
    headers and body, the body read within it, parse, the priority (body or X-Priority), run, answer."""
    gateway = request.app[GATEWAY]
    clock, telemetry = gateway.pool.clock, gateway.telemetry
    with _accepting(gateway) as arrived, telemetry.request(request.method, request.path, request.headers,
                                                           arrived, clock) as trace:
        header_ms = header_budget_ms(request.headers, gateway.limits.max_deadline_ms)
        body = await _read_body(request, header_ms)
        request[BODY_READ_AT] = time.perf_counter()
        spec = route.parse(body, gateway.limits)
        budget = budget_ms(spec.deadline_ms, header_ms, route.default_deadline_ms(gateway.settings.config.gateway))
        wire_id = gateway.wire_id(request[REQUEST_ID])
        if trace is not None:  # tracing on (gateway/telemetry.py)
            trace.span("receive", arrived, clock())
            telemetry.bind(wire_id, trace)
        limits = gateway.limits
        priority = resolve_priority(spec.priority, request.headers, limits.min_priority, limits.max_priority)
        answer = await route.run(gateway, spec, wire_id, arrived + budget / 1000.0, priority)
        answered = clock()
        if route.names_answer(spec):
            answer.id = request[REQUEST_ID]
        response = _json(answer)
        if trace is not None:
            trace.span("answer", answered, clock())
    return response


SCORE = WorkRoute(parse_score, lambda config: config.score_deadline_ms,
                  lambda gateway, spec, wire_id, deadline, priority: gateway.scoring.score(
                      spec, wire_id, deadline, priority=priority),
                  names_answer=lambda spec: spec.dialect != "sglang")
GENERATE = WorkRoute(parse_generate, lambda config: config.generate_deadline_ms,
                     lambda gateway, spec, wire_id, deadline, priority: gateway.generation.generate(
                         spec, wire_id, deadline, priority))
COMPLETIONS = WorkRoute(
    parse_completions, lambda config: max(config.score_deadline_ms, config.generate_deadline_ms),
    lambda gateway, spec, wire_id, deadline, priority: CompletionService(
        gateway.scoring, gateway.generation, gateway.settings.tokenizer).complete(
        spec, served_model(gateway, spec.model), wire_id, deadline, priority))


async def score(request: web.Request) -> web.Response:
    return await serve_work(request, SCORE)


async def generate(request: web.Request) -> web.Response:
    return await serve_work(request, GENERATE)


async def completions(request: web.Request) -> web.Response:
    return await serve_work(request, COMPLETIONS)


async def _serve_rerank(request: web.Request, shape: rerank_api.Shape) -> web.Response:
    """A rerank route: the score route's skeleton and defaults; the documents cut (with truncate) are named
    in a header on every shape (TEI's answer is a bare list)."""
    truncated: list[int] = []
    route = WorkRoute(rerank_api.parser(shape), lambda config: config.score_deadline_ms,
                      lambda gateway, spec, wire_id, deadline, priority: rerank(gateway, spec, wire_id, deadline,
                                                                                truncated, priority),
                      names_answer=lambda spec: spec.shape != "tei")
    response = await serve_work(request, route)
    if truncated:
        response.headers[TRUNCATED_HEADER] = ",".join(str(i) for i in sorted(truncated))
    return response


async def rerank_v1(request: web.Request) -> web.Response:
    return await _serve_rerank(request, "cohere-v1")


async def rerank_v2(request: web.Request) -> web.Response:
    return await _serve_rerank(request, "cohere-v2")


async def rerank_tei(request: web.Request) -> web.Response:
    return await _serve_rerank(request, "tei")


EMBEDDINGS = WorkRoute(parse_embeddings, lambda config: config.score_deadline_ms, embed, names_answer=lambda spec: False)


async def embeddings(request: web.Request) -> web.Response:
    return await serve_work(request, EMBEDDINGS)


async def models(request: web.Request) -> web.Response:
    return _json(model_list(request.app[SETTINGS]))


async def healthz(request: web.Request) -> web.Response:
    return _json(Health())


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    workers = [WorkerState(link.endpoint, link.state, link.pid, sorted(link.latency_models), len(link.in_flight),
                           link.refused_because or None)
               for link in gateway.pool.links]
    if gateway.draining:
        raise ApiError("draining", "the gateway is draining")
    if gateway.pool.ready_count() == 0:
        raise ApiError("no_workers", f"no worker is ready yet: {encode_json(workers).decode()}")
    return _json(Ready(workers=workers))


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[GATEWAY].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def admin_constraints(request: web.Request) -> web.Response:
    """A new catalogue version on every ready worker (gateway/catalog_admin.py)."""
    gateway = request.app[GATEWAY]
    update = parse_update(await _read_body(request, None))
    return _json(await gateway.catalogs.update(update))


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(request.app[GATEWAY].limits))
