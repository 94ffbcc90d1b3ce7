"""The replayer's HTTP/1.1 client (loadgen/http1.py) against a real socket server that answers as told."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.http1 import Http1Pool


class Server:
    """Reads each request whole (head and Content-Length body), answers the next of `answers`, and
    closes the connection after an answer when `close_after` says so."""

    def __init__(self, answers: list[bytes], close_after: bool = False) -> None:
        self.answers, self.close_after = answers, close_after
        self.connections, self.requests = 0, []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                writer.write(self.answers.pop(0))
                await writer.drain()
                if self.close_after:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()


def answer(status: int, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status} X\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def test_requests_go_whole_on_one_kept_alive_connection():
    server = Server([answer(200, b'{"ok":1}'), answer(503, b'{"error":{"code":"deadline_unmeetable"}}')])
    async with server as url:
        pool = Http1Pool(url + "/", [("Content-Type", "application/json")])
        first = await pool.exchange(pool.post("/v1/score", b'{"a":1}', [("X-Request-Id", "r-0")]))
        second = await pool.exchange(pool.post("/v1/score", b'{"b":22}'))
        pool.close()
    assert first[:2] == (200, b'{"ok":1}') and second[:2] == (503, b'{"error":{"code":"deadline_unmeetable"}}')
    assert server.connections == 1
    sent = server.requests[0]
    assert sent.startswith(b"POST /v1/score HTTP/1.1\r\n") and sent.endswith(b'\r\n\r\n{"a":1}')
    assert b"X-Request-Id: r-0\r\n" in sent and b"Content-Type: application/json\r\n" in sent
    assert b"Host: 127.0.0.1:" in sent and b"X-Request-Id" not in server.requests[1]


async def test_a_chunked_answer_is_read_whole_and_connection_close_is_obeyed():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    server = Server([chunked, answer(200, b"x")], close_after=True)
    async with server as url:
        pool = Http1Pool(url)
        assert (await pool.exchange(pool.post("/p", b"1")))[:2] == (200, b"abcde")
        assert (await pool.exchange(pool.post("/p", b"2")))[:2] == (200, b"x")
        pool.close()
    assert server.connections == 2


async def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one():
    server = Server([answer(200, b"a"), answer(200, b"b")], close_after=True)  # closes without saying so
    async with server as url:
        pool = Http1Pool(url)
        assert (await pool.exchange(pool.post("/p", b"1")))[:2] == (200, b"a")
        assert (await pool.exchange(pool.post("/p", b"2")))[:2] == (200, b"b")
        pool.close()
    assert server.connections == 2 and len(server.requests) == 2   # each request read once


async def test_an_answer_carries_its_headers_by_lowercased_name():
    server = Server([answer(429, b"{}", "Retry-After: 2", "X-Request-Id: r-7")])
    async with server as url:
        pool = Http1Pool(url)
        status, body, headers = await pool.exchange(pool.post("/p", b"1"))
        pool.close()
    assert (status, body) == (429, b"{}")
    assert headers["retry-after"] == "2" and headers["x-request-id"] == "r-7" and headers["content-length"] == "2"


def test_only_plain_http_urls_are_taken():
    with pytest.raises(ValueError, match="plain HTTP/1.1"):
        Http1Pool("https://example.com")
