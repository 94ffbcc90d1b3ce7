"""The ids a request carries on the wire, declared once: the gateway makes them, tools read them.

A caller's id (X-Request-Id, which callers may reuse) becomes a protocol-unique wire id
"<caller's id>~<n>"; a scoring request split across batches sends chunk k as "<wire id>#<k>". A
worker's events name requests by these ids; `client_id` recovers the caller's.
"""

from __future__ import annotations

WIRE_SEPARATOR = "~"
CHUNK_SEPARATOR = "#"


def wire_id(client_id: str, serial: int) -> str:
    """The protocol-unique id of a request the caller named `client_id` (the gateway's `serial`-th)."""
    return f"{client_id}{WIRE_SEPARATOR}{serial}"


def chunk_id(request_id: str, chunk: int) -> str:
    """The id of chunk `chunk` of a request split across batches."""
    return f"{request_id}{CHUNK_SEPARATOR}{chunk}"


def client_id(any_id: str) -> str:
    """The caller's own id inside a wire or chunk id (the caller's id may itself hold the separators)."""
    head, separator, tail = any_id.rpartition(WIRE_SEPARATOR)
    return head if separator and tail.split(CHUNK_SEPARATOR)[0].isdigit() else any_id


def is_chunk(any_id: str) -> bool:
    """Whether the id is a chunk of a request split across batches (the other chunks send its prefix too)."""
    head, separator, tail = any_id.rpartition(WIRE_SEPARATOR)
    serial, chunk, k = tail.partition(CHUNK_SEPARATOR)
    return bool(separator and serial.isdigit() and chunk and k.isdigit())
