"""Bad inputs for the chaos test: each must get a well-formed JSON error, and leave the gateway healthy.

Also the slow client: headers that promise a body, a few bytes of it, then silence (held open).
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp

NESTING = 100_000
BAD_BODIES: dict[str, bytes] = {
    "raw bytes": os.urandom(4096),
    "deeply nested arrays": b"[" * NESTING + b"]" * NESTING,
    "deeply nested objects": b'{"a":' * NESTING + b"1" + b"}" * NESTING,
    "NaN deadline": b'{"samples": ["x"], "labels": ["yes"], "deadline_ms": NaN}',
    "huge integer token id": b'{"samples": [{"input_ids": [1' + b"0" * 400 + b']}], "label_token_ids": [1]}',
    "huge integer deadline": b'{"samples": ["x"], "labels": ["yes"], "deadline_ms": 99999999999999999999}',
    "lone surrogate (escaped)": b'{"samples": ["\\ud800 shoe"], "labels": ["yes"]}',
    "lone surrogate (raw bytes)": b'{"samples": ["\xed\xa0\x80 shoe"], "labels": ["yes"]}',
    "100k labels": b'{"samples": ["x"], "labels": [' + b",".join([b'"yes"'] * 100_000) + b"]}",
    "100k samples": b'{"samples": [' + b",".join([b'"x"'] * 100_000) + b'], "labels": ["yes"]}',
    "wrong types everywhere": b'{"samples": {"a": 1}, "labels": 7, "deadline_ms": "soon", "top_k": []}',
    "empty body": b"",
    "JSON null": b"null",
}


async def send_bad(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, object]:
    """POST raw bytes to /v1/score; (status, parsed JSON or the raw text when it is not JSON)."""
    async with session.post(url + "/v1/score", data=body, headers={"Content-Type": "application/json"}) as response:
        text = await response.text()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, text


def is_error_body(answer: object) -> bool:
    error = answer.get("error") if isinstance(answer, dict) else None
    return isinstance(error, dict) and all(isinstance(error.get(k), str) and error[k]
                                           for k in ("code", "message", "request_id"))


async def stalled_client(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that promised 1000 bytes of body, sent 12, and goes quiet (the caller holds it)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/score HTTP/1.1\r\nHost: chaos\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n" + b'{"samples": ')
    await writer.drain()
    return reader, writer
