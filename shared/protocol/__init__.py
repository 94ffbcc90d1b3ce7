"""The gateway <-> worker wire protocol: every message declared once as a msgspec Struct, bounded decoding.

A message travels as two ZeroMQ frames: one byte naming its type (the union's tag: `TYPE` of each
message class), then a msgpack array of the message's fields in declaration order (nested records
likewise; `Ready.bounds` and `Ready.latency` values are maps of their fields, every bound present:
a Ready that leaves one out is refused, naming it). The worker binds a
ROUTER socket, gateways connect DEALER sockets, so on the worker side a peer identity frame comes first.

Conversation:
  gateway -> worker: Hello (version check), ScoreBatch, BeamBatch, Shutdown, Goodbye, CatalogSwap
  worker -> gateway: Ready (answers Hello), ScoreResults, BeamResults, Heartbeat (to every known
                     gateway), Error (a batch or frame that could not be served), Goodbye (leaving),
                     CatalogState (answers CatalogSwap)

Deadlines are relative budgets in milliseconds remaining when the message is sent; the receiver
converts them to its own monotonic clock. Token ids and tensors are raw little-endian bytes:
batches name their token dtype (int32 or int64); results use float32 and int32 (see each field).

    messages.py  the messages, error codes and statuses, the protocol version, the id arrays
    codec.py     encode, and decode of untrusted frames (every failure a ProtocolError naming the field)

Import from here (`from shared import protocol`); the two modules are how it is written down.
"""

from shared.protocol.codec import DEFAULT_LIMITS, DecodeLimits, ProtocolError, decode, encode, peek_batch_id
from shared.protocol.messages import (FLOAT32, INT32, MAX_CATALOG_NAME_CHARS, MAX_ID_CHARS, MAX_ITEMS, MESSAGE_TYPES, PROTOCOL_VERSION,
                                      TOKEN_DTYPES, BeamBatch, BeamRequest, BeamResult, BeamResults, CatalogState,
                                      CatalogSwap, Error,
                                      ErrorCode, Goodbye, Heartbeat, Hello, Message, PrefixCacheReport, Ready, Record,
                                      ResultStatus, ScoreBatch, ScoreRequest, ScoreResult, ScoreResults, Shutdown,
                                      Status, WorkerCounters, pack_ids, unpack_ids)

__all__ = [
    "DEFAULT_LIMITS", "FLOAT32", "INT32", "MAX_CATALOG_NAME_CHARS", "MAX_ID_CHARS", "MAX_ITEMS", "MESSAGE_TYPES", "PROTOCOL_VERSION",
    "TOKEN_DTYPES", "BeamBatch", "BeamRequest", "BeamResult", "BeamResults", "CatalogState", "CatalogSwap",
    "DecodeLimits", "Error", "ErrorCode",
    "Goodbye", "Heartbeat", "Hello", "Message", "PrefixCacheReport", "ProtocolError", "Ready", "Record", "ResultStatus", "ScoreBatch",
    "ScoreRequest", "ScoreResult", "ScoreResults", "Shutdown", "Status", "WorkerCounters", "decode", "encode",
    "pack_ids", "peek_batch_id", "unpack_ids",
]
