"""The one table from rejection reason to HTTP status, and the error raised to answer with it.

Every non-success answer of the gateway is `{"error": {"code", "message", "request_id"}}` with the
status this table gives for the code. Handlers raise `ApiError`; a middleware turns it into JSON.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec
from aiohttp import web

# code -> (HTTP status, one-line meaning for /openapi.json and the README's errors table)
ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "a field is missing, of the wrong type or out of range"),
    "unauthorized": (401, "missing or wrong bearer token"),
    "forbidden": (403, "an admin route on a gateway that has no bearer token configured (gateway.auth_token_env)"),
    "not_found": (404, "no such route"),
    "method_not_allowed": (405, "the route exists but not for this method"),
    "body_timeout": (408, "the body did not arrive before the request's deadline; nothing was computed"),
    "too_large": (413, "the body is over the size limit, or the input over the compiled bounds"),
    "client_closed": (499, "the client closed its connection before the answer (logs and metrics only: nothing "
                           "can be sent); work not yet computed is taken out of the queue"),
    "unsupported_encoding": (415, "the body's Content-Encoding is not gzip, deflate or identity"),
    "queue_full": (429, "the queue's token budget is spent; retry after Retry-After seconds"),
    "internal": (500, "a bug in the gateway; the message says where"),
    "deadline_unmeetable": (503, "the predicted finish time is past the deadline; refused before any work"),
    "no_workers": (503, "no worker is ready to serve this workload"),
    "worker_lost": (503, "the worker computing this request stopped answering"),
    "worker_error": (503, "the worker refused or failed the batch holding this request"),
    "draining": (503, "the gateway is shutting down and takes no new work"),
    "catalog_update_failed": (502, "a worker refused or did not answer a catalogue update; it keeps its current "
                                   "version"),
    "batcher_stopped": (503, "the gateway's batching loop for this workload stopped; its log says why"),
    "deadline_exceeded": (504, "the deadline passed before the answer was ready; the work was dropped"),
}


NOT_SENT = frozenset({"client_closed"})
"""Codes that only logs and metrics carry: no client is there to receive them."""
SENT = tuple(code for code in ERRORS if code not in NOT_SENT)


class ErrorDetail(msgspec.Struct):
    """What went wrong: the code (the table above), a message naming the field and the fix, the request id."""

    code: Literal[SENT]
    message: str
    request_id: str


class ErrorAnswer(msgspec.Struct):
    """Every non-success answer of the gateway."""

    error: ErrorDetail


class ApiError(Exception):
    """A request answered with an error from the table; `retry_after_s` sets Retry-After; `drop_reason`
    names the policy's reason when accepted work is dropped (gateway/metrics.py counts it)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None,
                 drop_reason: str | None = None) -> None:
        if code not in ERRORS:
            raise KeyError(f"unknown error code {code!r}; add it to gateway.errors.ERRORS")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.drop_reason = drop_reason

    @property
    def status(self) -> int:
        return ERRORS[self.code][0]


def error_response(error: ApiError, request_id: str) -> web.Response:
    """The JSON answer for `error`, with Retry-After when the error carries one."""
    body = ErrorAnswer(ErrorDetail(error.code, error.message, request_id))
    headers = {"X-Request-Id": request_id}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return web.Response(
        status=error.status, body=msgspec.json.encode(body), content_type="application/json", headers=headers
    )
