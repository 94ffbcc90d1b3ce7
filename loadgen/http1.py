"""A light HTTP/1.1 client for the replayer: keep-alive connections, each request sent as bytes
built before the run, each answer read to its last byte.

The replayer sends hundreds of requests a second from one core it may share with the gateway it
measures; aiohttp's client spent ~0.67 ms of CPU on each (URL, header and cookie objects, tracing
hooks), this one a fraction of that, so the client takes less of the core the gateway needs. It
speaks only what the gateway answers: plain http://, Content-Length or chunked bodies, keep-alive
unless the server says `Connection: close`. An answer comes back with its headers (names lowercased):
a client that retries reads Retry-After there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

HEAD_END = b"\r\n\r\n"


class Answer(NamedTuple):
    """One HTTP answer: its status, its whole body and its headers (lowercased names; a repeated
    header keeps its last value)."""

    status: int
    body: bytes
    headers: dict[str, str]


class Http1Pool:
    """Keep-alive connections to one http:// origin; `exchange` sends one request, returns its Answer."""

    def __init__(self, url: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the replayer speaks plain HTTP/1.1 to an http://host[:port] URL; got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in [("Host", parts.netloc), *headers])
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def post(self, path: str, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> bytes:
        """The bytes of a POST of `body` to `path` (under the URL's path), for `exchange`."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        return (f"POST {self._prefix}{path} HTTP/1.1\r\n{self._headers}{extra}"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def exchange(self, request: bytes) -> Answer:
        """Send `request` on an idle connection (or a new one) and read the whole answer. A reused
        connection the server closed before answering (its keep-alive ran out) is retried once on
        a new one: the request was never read."""
        if self._idle:
            reader, writer = self._idle.pop()
            try:
                return await self._on(reader, writer, request)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
            except ConnectionResetError:
                pass
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return await self._on(reader, writer, request)

    async def _on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> Answer:
        try:
            writer.write(request)
            answer, keep = await read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return answer

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def read_response(reader: asyncio.StreamReader) -> tuple[Answer, bool]:
    """One HTTP/1.1 answer and whether the connection may be reused."""
    head = await reader.readuntil(HEAD_END)
    lines = head[: -len(HEAD_END)].split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status, keep = int(status_line[1]), status_line[0] == b"HTTP/1.1"
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    connection = headers.get("connection", "").lower()
    keep = connection == "keep-alive" or (keep and connection != "close")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Answer(status, await _chunked(reader), headers), keep
    if "content-length" in headers:
        return Answer(status, await reader.readexactly(int(headers["content-length"])), headers), keep
    if status in (204, 304) or 100 <= status < 200:
        return Answer(status, b"", headers), keep
    return Answer(status, await reader.read(), headers), False  # until the server closes


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
