"""What the worker computed of one overload window, read from its batch_done lines (bench/harness/overload_window.py's
computed_batches): the lines are the worker's own (shared/logs.JsonLines formatting shared/events.BatchDone, as
EventLog.emit writes them), read back by loadgen/stack.batch_lines from a byte offset, as bench/overload.py reads a
window's lines from the shared worker's log."""

from __future__ import annotations

import logging

import msgspec

from bench.harness.overload_window import computed_batches, predicted_ms
from loadgen.stack import batch_lines
from shared.events import BatchDone
from shared.latency_model import LatencyModel
from shared.logs import JsonLines

MODEL = LatencyModel(0.01, 0.02, 0.3, 0.7)


def _line(event: BatchDone) -> str:
    """One worker log line of `event`, formatted as the worker's EventLog.emit formats it."""
    fields = msgspec.structs.asdict(event)
    del fields["ts"], fields["worker"]
    record = logging.LogRecord("worker", logging.INFO, __file__, 0, "batch_done", (), None)
    record.fields = {"worker": "w0", **fields}
    return JsonLines().format(record) + "\n"


def _write(log, events: list[BatchDone]) -> None:
    with log.open("a") as out:
        out.write("".join(_line(e) for e in events))


def test_a_windows_batches_are_summed_from_the_workers_lines_and_predicted_by_any_model(tmp_path):
    log = tmp_path / "worker-0.log"
    _write(log, [BatchDone(batch_id=1, request_ids=("w0-0~1",), queue_ms=0.1, compute_ms=5.0)])
    offset = log.stat().st_size  # an earlier window's line: before the offset
    shapes = {"w1-0": ("score", 8, 480), "w1-1": ("score", 4, 200), "w1-2": ("score", 16, 960),
              "w1-3": ("score", 8, 400), "w1-4": ("score", 8, 400)}
    _write(log, [BatchDone(batch_id=2, request_ids=("w1-0~2", "w1-1~3"), queue_ms=0.2, compute_ms=9.0),
                 BatchDone(batch_id=3, request_ids=("w1-2~4", "w1-3~5"), queue_ms=0.2, compute_ms=4.0,
                           expired=("w1-3~5",)),  # only w1-2 computed
                 BatchDone(batch_id=4, request_ids=("w1-4~6",), queue_ms=0.0, compute_ms=0.0, expired=("w1-4~6",)),
                 BatchDone(batch_id=5, request_ids=("other~7",), queue_ms=0.0, compute_ms=3.0)])  # another's
    with log.open("a") as out:
        out.write('{"ts": 1.0, "level": "info", "logger": "worker", "event": "an_event_of_another_kind"}\n')
    read = batch_lines(log, offset)
    assert [line.request_ids for line in read] == [("w1-0", "w1-1"), ("w1-2", "w1-3"), ("w1-4",), ("other",)]
    computed = computed_batches(read, shapes)
    assert computed == {"batches": 2, "items": 28, "tokens": 1640, "tokens_per_item": round(680 / 12 + 60, 3),
                        "compute_ms": 13.0, "left_out": 0}
    assert abs(predicted_ms(computed, MODEL) - MODEL.predict_ms(12, 680 / 12) - MODEL.predict_ms(16, 60)) < 1e-2


def test_a_batch_holding_part_of_a_split_request_is_left_out_and_counted(tmp_path):
    """A request cut into chunks names its caller's id in each chunk's batch: which share of it a batch computed
    the line does not say, so those batches are counted, not summed."""
    log = tmp_path / "worker-0.log"
    shapes = {"w2-0": ("score", 20, 1200), "w2-1": ("score", 4, 240)}
    _write(log, [BatchDone(batch_id=1, request_ids=("w2-0~1#0", "w2-1~2"), queue_ms=0.0, compute_ms=9.0),
                 BatchDone(batch_id=2, request_ids=("w2-0~1#1",), queue_ms=0.0, compute_ms=3.0)])
    assert computed_batches(batch_lines(log), shapes) == {"batches": 0, "items": 0, "tokens": 0,
                                                          "tokens_per_item": 0, "compute_ms": 0, "left_out": 2}
