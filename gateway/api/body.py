"""Reading a request's body: in time, within the size limit, decompressed by the gateway itself.

aiohttp's own decompression is off (make_app): with it on, a body that does not decompress surfaced
as an exception the routes did not expect (a 500), a truncated gzip stream as an empty or cut body,
and an encoding it has no library for (br, zstd) as a plain-text 400 before any route ran. Here
each of those gets the JSON error of gateway/errors.py naming the encoding and the problem.

A body must arrive before the request's deadline could pass: the smallest deadline its headers give,
else the longest any request may have (`[gateway] max_deadline_ms`), counted from when the route
starts reading it (on arrival). A client that stalls mid-body gets 408 `body_timeout` then, with
`Connection: close` (gateway/app.py closes any connection answered before its body was read).
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from gateway.errors import ApiError

GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip member: header, deflate stream, CRC-32 and size
ZLIB_WBITS = zlib.MAX_WBITS  # HTTP's "deflate" as RFC 9110 defines it: a zlib stream
RAW_WBITS = -zlib.MAX_WBITS  # what many clients send as "deflate" instead: a bare deflate stream
ENCODINGS = ("gzip", "x-gzip", "deflate", "identity")
CHUNK = 1 << 16  # bytes of compressed input handed to zlib at a time
MAX_MEMBERS = 16  # gzip members one body may hold (`cat a.gz b.gz`); each costs a decompressor


async def read_body(request: web.Request, limit: int, budget_ms: int) -> bytes:
    """The body, decompressed: 408 when it has not arrived within `budget_ms` of now, 413 over `limit`
    bytes (as sent or decompressed), 415 for an encoding other than gzip or deflate, 400 when empty or
    when it does not decompress."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if encoding not in ENCODINGS:
        raise ApiError("unsupported_encoding", f"Content-Encoding {encoding!r} is not taken: send the body as "
                                               "gzip, deflate or identity (uncompressed), one encoding at most")
    if request.content_length is not None and request.content_length > limit:
        raise ApiError("too_large", f"the body is {request.content_length} bytes; the limit is {limit} bytes")
    try:
        async with asyncio.timeout(budget_ms / 1000.0):
            raw = await request.read()
    except TimeoutError:
        raise ApiError("body_timeout", f"the body did not arrive within {budget_ms} ms (the request's deadline, "
                                       "or the longest a request may have); nothing was computed") from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError("too_large", f"the body is over the limit of {limit} bytes") from None
    except ConnectionResetError:  # aiohttp's "Connection lost": the client left mid-body
        raise ApiError("client_closed", "the client closed its connection while sending the body") from None
    if encoding in ("gzip", "x-gzip", "deflate") and raw:
        raw = decompress(raw, encoding, limit)
    if not raw:
        raise ApiError("invalid_request", "the body is empty; send a JSON object")
    return raw


def decompress(raw: bytes, encoding: str, limit: int) -> bytes:
    """`raw` decoded as `encoding` (gzip, up to MAX_MEMBERS members, or deflate with or without the zlib
    wrapper); 413 once it passes `limit` bytes, 400 when it is not such a stream, is cut short or has bytes
    after its end. The input goes in CHUNK-byte slices, so what zlib copies past a member's end is at most
    one slice: work linear in the body, as the member cap bounds the members' own overhead."""
    out, data, pos, members = bytearray(), memoryview(raw), 0, 0
    while pos < len(data):
        members += 1
        if members > MAX_MEMBERS:
            raise _undecodable(encoding, f"more than {MAX_MEMBERS} gzip members; send one")
        wbits = GZIP_WBITS if encoding != "deflate" else ZLIB_WBITS if _zlib_header(data[pos:pos + 2]) else RAW_WBITS
        stream = zlib.decompressobj(wbits)
        while not stream.eof and pos < len(data):
            chunk = data[pos:pos + CHUNK]
            pos += len(chunk)
            try:
                out += stream.decompress(chunk, limit + 1 - len(out))
            except zlib.error as exc:
                raise _undecodable(encoding, str(exc)) from None
            if len(out) > limit:
                raise ApiError("too_large", f"the body decompresses ({encoding}) to more than the limit of {limit} "
                                            "bytes")
        if not stream.eof:
            raise _undecodable(encoding, "the compressed stream ends early (the body was cut short)")
        pos -= len(stream.unused_data)  # the bytes of the last slice past this stream's end
        if pos < len(data) and (encoding == "deflate" or data[pos:pos + 2] != b"\x1f\x8b"):
            raise _undecodable(encoding, f"{len(data) - pos} bytes follow the end of the compressed stream")
    return bytes(out)


def _zlib_header(data: bytes) -> bool:
    """Whether `data` starts with a zlib header (deflate method, a check value divisible by 31)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def _undecodable(encoding: str, why: str) -> ApiError:
    return ApiError("invalid_request", f"the body could not be decompressed as Content-Encoding {encoding}: {why}")
