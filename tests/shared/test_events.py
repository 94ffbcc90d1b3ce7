"""shared/events.py: what a worker emits through its log is read back by type, every other line skipped."""

import logging

from shared.events import (BatchDone, Profiled, ProfileRefitFailed, Serving, Standby, parse_events,
                           read_events)
from shared.logs import EventLog, JsonLines


def _emitted(tmp_path, *events):
    """The lines EventLog.emit writes through the processes' own formatter, as a log file."""
    path = tmp_path / "worker.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(JsonLines())
    logger = logging.getLogger("test-events")
    logger.handlers[:], logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    try:
        log = EventLog("test-events", worker="w7")
        log.info("loaded", workload="score", alpha=5.0)  # an event for people, not declared
        for event in events:
            log.emit(event)
        logger.warning("batch_done lookalike")  # a plain message naming a tag
    finally:  # no handler left behind for a later test
        logger.handlers[:], logger.propagate = [], True
        handler.close()
    return path


def test_emitted_events_read_back_by_type_with_time_and_worker(tmp_path):
    profiled = Profiled(workload="score", points=9, rmse_ms=0.25, alpha=0.1, beta=0.2, gamma=0.3, delta=0.4)
    batch = BatchDone(batch_id=3, request_ids=("a~1", "b~2#0"), queue_ms=1.5, compute_ms=7.25,
                      expired=("b~2#0",), rejected={"c~3": "too long"})
    path = _emitted(tmp_path, Standby(), profiled, batch, ProfileRefitFailed(error="boom"),
                    Serving(endpoint="ipc:///x", pid=12, workloads=("score",)))
    events = read_events(path)
    assert [type(e) for e in events] == [Standby, Profiled, BatchDone, ProfileRefitFailed, Serving]
    assert all(e.worker == "w7" and e.ts > 0 for e in events)
    got = read_events(path, BatchDone)[0]
    assert (got.request_ids, got.expired, got.rejected, got.compute_ms) == (batch.request_ids, batch.expired,
                                                                           batch.rejected, 7.25)
    assert read_events(path, Profiled)[0].coefficients() == {"alpha": 0.1, "beta": 0.2, "gamma": 0.3, "delta": 0.4}


def test_lines_that_are_not_declared_events_are_skipped():
    text = ('plain text\n{"event":"batch_done","batch_id":"not an int"}\n{"event":"standby"\n'
            '[worker 1] {"event":"standby","worker":"w1"}\n')
    assert list(parse_events(text)) == [Standby(worker="w1")]
    assert read_events("/nonexistent/worker.log") == []
