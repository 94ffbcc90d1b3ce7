"""Wire protocol: every message type round-trips; malformed frames give a ProtocolError, never a crash."""

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import protocol
from shared.bounds import Bounds
from shared.latency_model import LatencyModel

BOUNDS = Bounds(max_samples_per_batch=16).resolved()
BOUNDS_MAP = dataclasses.asdict(BOUNDS)


def score_batch(token_dtype="int32"):
    ids = protocol.pack_ids([1, 2, 3, 4, 5, 6], token_dtype)
    return protocol.ScoreBatch(
        batch_id=7,
        token_dtype=token_dtype,
        requests=(
            protocol.ScoreRequest("r1", 12.5, ids, (2, 4), (10, 11), 3, True),
            protocol.ScoreRequest("r2", -1.0, ids[: 2 * np.dtype(token_dtype).itemsize], (2,), (), 0),
            protocol.ScoreRequest("r3", 5.0, ids, (0, 2, 1), (10,), 0, False, prefix_len=3,  # prefix 1 2 3
                                  traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            protocol.ScoreRequest("r4", 5.0, ids, (6,), (), 1, prompt_logprobs=2),  # per-token log-probs
        ),
    )


def f32(*shape):
    return np.arange(int(np.prod(shape)), dtype="<f4").reshape(shape).tobytes()


EXAMPLES = [
    protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, gateway_id="gw-1"),
    protocol.Ready(
        protocol_version=protocol.PROTOCOL_VERSION, worker_id="w0", device="cpu", pid=123,
        workloads=("score", "beam"), bounds=BOUNDS,
        model={"hidden_size": 64, "dtype": "float32", "has_head": False, "scale": 0.5},
        latency={"score": LatencyModel(0.1, 5.7, 0.01, 43.67)},
    ),
    score_batch("int32"),
    score_batch("int64"),
    protocol.ScoreResults(
        batch_id=7,
        results=(
            protocol.ScoreResult("r1", protocol.Status.OK, num_samples=2, label_logits=f32(2, 2),
                          label_logprobs=f32(2, 2), label_probs=f32(2, 2),
                          topk_ids=np.zeros((2, 3), "<i4").tobytes(), topk_logprobs=f32(2, 3),
                          hidden=f32(2, 8), cached_tokens=7),
            protocol.ScoreResult("r2", protocol.Status.EXPIRED),
            protocol.ScoreResult("r3", protocol.Status.ERROR, error="sample 0 has 900 tokens > 512"),
            protocol.ScoreResult("r4", protocol.Status.OK, num_samples=1, topk_ids=np.zeros((1, 1), "<i4").tobytes(),
                                 topk_logprobs=f32(1, 1), token_logprobs=f32(5),
                                 token_topk_ids=np.arange(10, dtype="<i4").tobytes(), token_topk_logprobs=f32(5, 2)),
        ),
        queue_ms=0.1, compute_ms=3.0,
    ),
    protocol.BeamBatch(
        batch_id=9, token_dtype="int64", num_beams=4, max_new_tokens=3, num_return_sequences=2,
        requests=(protocol.BeamRequest("b1", 50.0, protocol.pack_ids([5, 6, 7], "int64"),
                                       "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                  protocol.BeamRequest("b2", 50.0, protocol.pack_ids([5], "int64"), catalog="de")),
    ),
    protocol.BeamResults(
        batch_id=9,
        results=(protocol.BeamResult("b1", protocol.Status.OK, sequences=np.zeros((2, 3), "<i4").tobytes(),
                              scores=f32(2), lengths=np.full(2, 3, "<i4").tobytes(), catalog_version=3),
                 protocol.BeamResult("b2", protocol.Status.ERROR, error="catalogue 'de' is not loaded (loaded: default)")),
        queue_ms=0.0, compute_ms=1.5,
    ),
    protocol.CatalogSwap(request_id="admin-1", load={"default": "/catalogs/items.npz", "de": "/catalogs/de.txt"},
                  unload=("fr",)),
    protocol.CatalogState(request_id="admin-1", version=4, items={"default": 1_000_000, "de": 2}, nodes=2_132_704,
                   max_nodes=4_000_000, load_s=0.21),
    protocol.CatalogState(request_id="admin-2", version=4, error="catalogue 'de' has a node with 70 children, more than "
                                                          "beam.max_catalog_fanout = 64"),
    protocol.Heartbeat(worker_id="w0", queue_depth=1, in_flight=2, draining=False,
                counters=protocol.WorkerCounters(batches_computed=4, requests_expired=2)),
    protocol.Error(code=protocol.ErrorCode.OVERLOADED, message="queue full (8 batches)", batch_id=7),
    protocol.Error(code=protocol.ErrorCode.MALFORMED, message="bad frame"),
    protocol.Shutdown(reason="test"),
    protocol.Goodbye(sender_id="w0", reason="draining"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    frames = protocol.encode(message)
    assert len(frames) == 2 and frames[0] == bytes([message.TYPE])
    assert protocol.decode(frames) == message


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(protocol.MESSAGE_TYPES.values())


def test_arrays_helpers():
    results = EXAMPLES[4].results
    arrays = results[0].arrays()
    assert arrays["label_logits"].shape == (2, 2) and arrays["hidden"].shape == (2, 8)
    assert arrays["topk_ids"].dtype == np.int32 and "head" not in arrays
    assert results[1].arrays() == {}
    assert results[0].token_arrays() == {}
    tokens = results[3].token_arrays()
    assert tokens["token_logprobs"].shape == (5,) and tokens["token_topk_ids"].shape == (5, 2)
    assert tokens["token_topk_ids"][4].tolist() == [8, 9] and tokens["token_topk_logprobs"].dtype == np.float32
    beam = EXAMPLES[6].results[0].arrays(num_return_sequences=2)
    assert beam["sequences"].shape == (2, 3) and list(beam["lengths"]) == [3, 3]
    ids = protocol.unpack_ids(protocol.pack_ids([1, 2**31 - 1], "int32"), "int32")
    assert ids.tolist() == [1, 2**31 - 1]


def test_numpy_scalars_encode_as_plain_numbers():
    msg = protocol.Error(code="internal", message="x", batch_id=np.int64(5))
    assert protocol.decode(protocol.encode(msg)).batch_id == 5


def body(*fields):
    return msgpack.packb(list(fields))


BAD = [
    ([b"\x03"], "expected 2 frames"),
    ([b"\x63", b"\x90"], "unknown message type"),
    ([b"\x01", b"\xc1"], "invalid Hello"),
    ([b"\x01", body(1)], "the message = \\[1\\] must be an array of its 2 fields protocol_version, gateway_id"),
    ([b"\x01", body("1", "gw")], "invalid Hello: protocol_version = \"1\" must be an integer"),
    ([b"\x01", body(True, "gw")], "protocol_version = true must be an integer"),
    ([b"\x01", body(1, "gw") + b"\x00"], "trailing characters"),
    ([b"\x08", body("internal", "y", 1.5)], "batch_id"),
    ([b"\x08", body("x", "y", 1)], "code"),  # not an ErrorCode
    ([b"\x03", body(1, "int16", [["r", 1.0, b"\x00\x00", [1], [], 0, False, 0]])], "token_dtype"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00\x00\x00", [1], [], 0, False, 0]])], "whole number"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [1], [], 0, False, 0]])], "sum 1 != 2"),
    ([b"\x03", body(1, "int32", [])], "requests = \\[\\] must be a non-empty list of arrays of its 10 fields request_id"),
    ([b"\x03", body(1, "int32", [["r", float("nan"), b"\x00" * 4, [1], [], 0, False, 0]])], "requests\\[0\\].deadline_ms: expected a finite number"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 4, [1], [], 0, False, 0]] * 2)], "duplicate"),
    ([b"\x05", body(1, "int32", 2, 3, 5, [["r", 1.0, b"\x00" * 4]])], "num_return_sequences"),
    ([b"\x02", body(1, "w", "cpu", 1, [], BOUNDS_MAP, {}, {"score": [1.0, 2.0]})], "latency\\[...\\] must be an object with fields alpha, beta, gamma, delta"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [1], [], 0, False, -1]])], "requests\\[0\\].prefix_len = -1 must be an integer of at least 0"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [0, 2], [], 0, False, 0]])], ">= 1 token"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [-1, 1], [], 0, False, 2]])], "sample_lens\\[0\\] = -1 must be an integer of at least 0"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 12, [0, 1], [], 0, False, 1]])], "prefix_len 1 \\+ sum 1 != 3"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [1], [], 0, False, 0, "", 0, 0]])], "requests\\[0\\] = .* must be an array of its 10 fields .* \\(the first 6 required\\)"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 8, [1], [], 0, False, 0, "00-xyz"]])], "requests\\[0\\].traceparent = \"00-xyz\" must be"),
    ([b"\x04", body(1, [["r", "ok", "", 0, b"", b"", b"", b"", b"", b"", b"", -2]], 0.0, 1.0)], "cached_tokens"),
    ([b"\x02", body(2, "w", "cpu", 1, [], {**BOUNDS_MAP, "max_top_k": "5"}, {}, {})], "bounds.max_top_k = \"5\" must be an integer"),
    ([b"\x02", body(2, "w", "cpu", 1, [], {**BOUNDS_MAP, "max_samples_per_batch": 1}, {}, {})], "bounds.max_samples_per_batch = 1 must be an integer of at least 2"),
    ([b"\x01", msgpack.packb(msgpack.ExtType(1, b"x"))], "the message = <Ext> must be"),
    ([b"\x03", body(1, "int32", [["", 1.0, b"\x00" * 4, [1], [], 0, False, 0]])], "requests\\[0\\].request_id"),
    ([b"\x03", body(1, "int32", [["r" * 257, 1.0, b"\x00" * 4, [1], [], 0, False, 0]])], "request_id = \"rrr.* must be a string between 1 and 256 characters"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 4, [1], [3, -2], 0, False, 0]])], "label_ids\\[1\\] = -2 must be an integer of at least 0"),
    ([b"\x03", body(1, "int32", [["r", 1.0, b"", [], [], 0, False, 0]])], "sample_lens = \\[\\] must be a non-empty list of integers"),
    ([b"\x05", body(1, "int32", 0, 3, 1, [["r", 1.0, b"\x00" * 4]])], "num_beams = 0 must be an integer of at least 1"),
    ([b"\x05", body(1, "int32", 2, 3, 1, [["r", 1.0, b""]])], "prompt_ids: a prompt needs at least one token"),
    ([b"\x06", body(1, [["r", "done", "", b"", b"", b""]], 0.0, 1.0)], "results\\[0\\].status = \"done\" must be one of ok, expired, error"),
    ([b"\x06", body(1, [], float("inf"), 1.0)], "queue_ms: expected a finite number"),
    ([b"\x07", body("w", 0, 0, False, [1, 2, 3, 4, 5, 6])], "counters = \\[1,2,3,4,5,6\\] must be an array of its 5 fields batches_computed.* \\(each optional\\)"),
    ([b"\x02", body(3, "w", "cpu", 1, [], BOUNDS_MAP, {}, {"score": {"alpha": 1.0}})], "missing required field latency\\[...\\].beta \\(a number\\)"),
    ([b"\x01", b"\x91" * 5000], "invalid Hello"),
    ([b"\x01", body(protocol.PROTOCOL_VERSION, "G" * 257)], "gateway_id = \"GGG.* must be a string between 1 and 256"),
    ([b"\x05", body(1, "int32", 2, 3, 1, [["r", 1.0, b"\x00" * 4, "", "m" * 65]])], "requests\\[0\\].catalog = \"mmm.* must be a string of at most 64"),
    ([b"\x06", body(1, [["r", "ok", "", b"", b"", b"", -1]], 0.0, 1.0)], "results\\[0\\].catalog_version = -1 must be an integer of at least 0"),
    ([b"\x0b", body("a", {}, [])], "invalid CatalogSwap at load: empty"),
    ([b"\x0b", body("a", {"de": "/x.npz"}, ["de"])], "invalid CatalogSwap at unload: 'de' both loaded and unloaded"),
    ([b"\x0b", body("a", {"": "/x.npz"}, [])], "invalid CatalogSwap"),
    ([b"\x0b", body("a", {"de": ""}, [])], "invalid CatalogSwap: load\\[...\\] must be a string between 1 and 4096"),
]


def ready_body(bounds: dict) -> bytes:
    return body(protocol.PROTOCOL_VERSION, "w", "cpu", 1, ["score"], bounds, {}, {})


def test_a_ready_without_bounds_is_refused_naming_every_bound():
    with pytest.raises(protocol.ProtocolError, match="invalid Ready at bounds: missing " + ", ".join(BOUNDS_MAP) + ": a worker "
                                              "announces every bound"):
        protocol.decode([b"\x02", ready_body({})])


def test_a_ready_lacking_some_bounds_names_those_and_never_takes_their_defaults():
    some = {k: v for k, v in BOUNDS_MAP.items() if k not in ("max_labels", "max_prefix_tokens")}
    with pytest.raises(protocol.ProtocolError, match=r"invalid Ready at bounds: missing max_labels, max_prefix_tokens: "):
        protocol.decode([b"\x02", ready_body(some)])
    # every bound present (an unset max_prefix_tokens travels as nil) decodes as sent
    ready = protocol.decode([b"\x02", ready_body({**BOUNDS_MAP, "max_prefix_tokens": None})])
    assert ready.bounds == dataclasses.replace(BOUNDS, max_prefix_tokens=None)


@pytest.mark.parametrize("frames,match", BAD)
def test_malformed_frames_raise_protocol_error(frames, match):
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.decode(frames)


def test_size_limits():
    limits = protocol.DecodeLimits(max_frame_bytes=64, max_bin_len=16)
    big = protocol.encode(protocol.Goodbye(sender_id="x" * 100))
    with pytest.raises(protocol.ProtocolError, match="exceeds 64"):
        protocol.decode(big, limits)
    frames = protocol.encode(protocol.BeamBatch(1, "int32", 1, 1, 1, (protocol.BeamRequest("r", 1.0, b"\x00" * 20),)))
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(frames, protocol.DecodeLimits(max_bin_len=16))


def test_wire_layout_is_an_array_of_fields_in_declaration_order():
    batch = score_batch("int32")
    decoded = msgpack.unpackb(protocol.encode(batch)[1])
    assert decoded[:2] == [7, "int32"]
    assert decoded[2][2] == ["r3", 5.0, batch.requests[2].input_ids, [0, 2, 1], [10], 0, False, 3,
                             "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None]


def test_trailing_fields_with_defaults_may_be_left_out():
    """msgspec's array_like rule: a record cut short after its required fields takes the defaults
    (our encoder always writes every field; a longer record is refused, see BAD)."""
    message = protocol.decode([b"\x03", body(1, "int32", [["r", 1.0, b"\x00" * 4, [1], [], 0]])])
    assert message.requests[0].return_hidden is False and message.requests[0].prefix_len == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=512))
def test_fuzz_random_frames_never_crash(type_byte, data):
    try:
        protocol.decode([bytes([type_byte]), data])
    except protocol.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_fuzz_mutated_valid_frames_never_crash(message, data):
    raw = bytearray(protocol.encode(message)[1])
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        protocol.decode([bytes([message.TYPE]), bytes(raw[:cut])])
    except protocol.ProtocolError:
        pass


def test_peek_batch_id_of_a_malformed_batch():
    assert protocol.peek_batch_id([b"\x03", body(42, "int16", [])]) == 42
    assert protocol.peek_batch_id([b"\x05", body(7)]) == 7
    assert protocol.peek_batch_id([b"\x03", b"\xc1"]) is None
    assert protocol.peek_batch_id([b"\x01", body(1, "gw")]) is None
    assert protocol.peek_batch_id([b"\x03", body("x")]) is None
    assert protocol.peek_batch_id([b"\x03", body(2**64 - 1)]) is None


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)
INT64 = range(-(2**63), 2**63)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([3, 5]), st.binary(max_size=64))
def test_fuzz_peek_of_random_bytes_gives_an_int64_or_nothing(type_byte, data):
    found = protocol.peek_batch_id([bytes([type_byte]), data])
    assert found is None or (type(found) is int and found in INT64), found


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([3, 5]), msgpack_values, st.lists(msgpack_values, max_size=4))
def test_fuzz_peek_reads_the_first_field_of_any_batch_shaped_array(type_byte, head, rest):
    """Whatever follows it, the first element of a msgpack array is the batch id when it is an
    int64 integer (so a malformed batch is still failed by id), and nothing otherwise."""
    found = protocol.peek_batch_id([bytes([type_byte]), msgpack.packb([head, *rest])])
    assert found == (head if type(head) is int and head in INT64 else None), (head, found)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(protocol.MESSAGE_TYPES)), st.lists(msgpack_values, max_size=14))
def test_fuzz_well_formed_msgpack_of_any_shape_is_refused_only_by_protocol_error(type_byte, fields):
    """Valid msgpack arrays reach the schema and the cross-field checks, unlike random bytes."""
    try:
        protocol.decode([bytes([type_byte]), msgpack.packb(fields)])
    except protocol.ProtocolError as exc:
        assert str(exc).startswith("invalid " + protocol.MESSAGE_TYPES[type_byte].__name__)
