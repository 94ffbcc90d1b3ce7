"""Reading the body (gateway/api/body.py): compressed bodies decoded by the gateway, every failure
answered in JSON; a body that stalls answered 408 at its deadline; a field named twice refused."""

from __future__ import annotations

import asyncio
import gzip
import os
import zlib

import orjson
import pytest

from gateway.errors import ApiError
from gateway.api.body import CHUNK, MAX_MEMBERS, decompress
from tests.gateway.test_gateway_rejections import assert_error

BODY = {"samples": ["red shoe", {"input_ids": [3, 4, 5]}], "labels": ["yes"]}
RAW = orjson.dumps(BODY)


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("encoding, packed", [
    # mtime=0: the same bytes in every process, so pytest-xdist's workers collect the same test ids
    ("gzip", gzip.compress(RAW, mtime=0)),
    ("x-gzip", gzip.compress(RAW, mtime=0)),
    ("gzip", gzip.compress(RAW[:20], mtime=0) + gzip.compress(RAW[20:], mtime=0)),  # two members, as `cat a.gz b.gz` makes
    ("deflate", zlib.compress(RAW)),  # the zlib stream RFC 9110 names
    ("deflate", raw_deflate(RAW)),  # the bare stream many clients send
])
def test_each_encoding_decompresses_to_the_body(encoding, packed):
    assert decompress(packed, encoding, limit=len(RAW)) == RAW


@pytest.mark.parametrize("encoding, packed, words", [
    ("gzip", b"not gzip at all", "could not be decompressed as Content-Encoding gzip"),
    ("deflate", b"not-deflate", "could not be decompressed as Content-Encoding deflate"),
    ("gzip", gzip.compress(RAW, mtime=0)[:-9], "ends early (the body was cut short)"),
    ("gzip", b"\x1f\x8b\x08\x00garbage", "Content-Encoding gzip"),
    ("gzip", gzip.compress(RAW, mtime=0) + b"junk", "4 bytes follow the end of the compressed stream"),
    ("deflate", zlib.compress(RAW) + b"junk", "4 bytes follow the end of the compressed stream"),
])
def test_a_body_that_does_not_decompress_is_refused_naming_the_encoding(encoding, packed, words):
    with pytest.raises(ApiError) as refused:
        decompress(packed, encoding, limit=1 << 20)
    assert refused.value.status == 400 and words in refused.value.message, refused.value.message


def test_a_stream_longer_than_one_slice_and_its_trailing_bytes():
    text = orjson.dumps({"samples": [os.urandom(64).hex() for _ in range(4000)]})  # ~0.5 MB, little to compress
    for encoding, packed in (("gzip", gzip.compress(text, mtime=0)), ("deflate", zlib.compress(text))):
        assert len(packed) > 3 * CHUNK
        assert decompress(packed, encoding, limit=len(text)) == text
        with pytest.raises(ApiError, match="2 bytes follow the end of the compressed stream"):
            decompress(packed + b"!!", encoding, limit=len(text))


def test_gzip_members_are_capped():
    """A body of many tiny members would cost a decompressor each: more than MAX_MEMBERS is refused."""
    assert decompress(gzip.compress(b"", mtime=0) * (MAX_MEMBERS - 1) + gzip.compress(RAW, mtime=0), "gzip", len(RAW)) == RAW
    with pytest.raises(ApiError, match=f"more than {MAX_MEMBERS} gzip members"):
        decompress(gzip.compress(b"", mtime=0) * 200_000, "gzip", limit=4 << 20)


def test_a_body_that_decompresses_past_the_limit_is_413():
    bomb = gzip.compress(b" " * (1 << 22))  # 4 MiB of spaces in about 4 KB
    with pytest.raises(ApiError) as refused:
        decompress(bomb, "gzip", limit=1 << 20)
    assert refused.value.status == 413 and "decompresses (gzip) to more than" in refused.value.message


async def test_compressed_bodies_are_answered_as_the_plain_one(stack):
    plain = await stack.client.post("/v1/score", data=RAW)
    assert plain.status == 200
    want = (await plain.json())["scores"]
    for encoding, packed in (("gzip", gzip.compress(RAW, mtime=0)), ("deflate", zlib.compress(RAW))):
        response = await stack.client.post("/v1/score", data=packed, headers={"Content-Encoding": encoding})
        assert response.status == 200, await response.text()
        assert (await response.json())["scores"] == want


@pytest.mark.parametrize("encoding, packed, status, code, words", [
    ("deflate", b"not-deflate", 400, "invalid_request", ["Content-Encoding deflate"]),
    ("gzip", gzip.compress(RAW, mtime=0)[:-9], 400, "invalid_request", ["cut short"]),
    ("br", RAW, 415, "unsupported_encoding", ["'br'", "gzip, deflate or identity"]),
    ("gzip, deflate", RAW, 415, "unsupported_encoding", ["one encoding at most"]),
    ("gzip", gzip.compress(b" " * (5 << 20)), 413, "too_large", ["decompresses"]),
])
async def test_encoding_failures_get_json_errors_and_the_gateway_serves_on(stack, encoding, packed, status, code,
                                                                          words):
    response = await stack.client.post("/v1/score", data=packed, headers={"Content-Encoding": encoding})
    assert response.headers["Content-Type"].startswith("application/json")
    assert_error(response.status, await response.json(), status, code, *words)
    assert (await stack.client.post("/v1/score", data=RAW)).status == 200


@pytest.mark.parametrize("body, name", [
    (b'{"samples": ["a"], "samples": ["b", "c"], "labels": ["yes"]}', "'samples' 2 times"),
    (b'{"samples": [{"text": "a", "text": "bbbb"}], "labels": ["yes"]}', "'text' 2 times"),
    (b'{"samples": [{"input_ids": [1, 2]}], "labels": ["yes"], "deadline_ms": 1, "deadline_ms": 5000}',
     "'deadline_ms' 2 times"),
    # a copy that breaks its type or a bound: the repetition is said, not the last copy's value
    (b'{"samples": [' + b'"a", ' * 200 + b'"a"], "samples": ["a"], "labels": ["yes"]}', "'samples' 2 times"),
    (b'{"samples": ["a"], "output": "topk", "top_k": -1, "top_k": 3}', "'top_k' 2 times"),
])
async def test_a_field_named_twice_in_one_object_is_refused(stack, body, name):
    response = await stack.client.post("/v1/score", data=body)
    assert_error(response.status, await response.json(), 400, "invalid_request", name, "give each field once")


async def test_a_repeated_field_of_generate_is_refused(stack):
    response = await stack.client.post("/v1/generate", data=b'{"prompt": "a", "prompt": "b"}')
    assert_error(response.status, await response.json(), 400, "invalid_request", "'prompt' 2 times")


async def test_a_body_that_stalls_is_answered_408_at_its_deadline_and_the_connection_not_reused(stack):
    reader, writer = await asyncio.open_connection(stack.client.host, stack.client.port)
    head = (b"POST /v1/score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\nX-Deadline-Ms: 200\r\n\r\n")
    writer.write(head + b'{"samples": ')  # and nothing more
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length"))
    body = await reader.readexactly(length)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head, head
    assert_error(408, orjson.loads(body), 408, "body_timeout", "within 200 ms", "nothing was computed")
