"""A lane's turn covers the enqueue of a node call only: the runners wait for the outputs
(Pending.result(), worker/runtime/transfer.py) after releasing it, so on a GPU another lane enqueues while
this one's batch computes and its outputs travel. Real nodes; the wait is observed, not replaced."""

import pytest

from worker.runtime.loader import load_nodes
from worker.runtime.transfer import Pending
from shared import protocol
from worker.lanes import Lane, max_staged_tokens
from worker.runner import BeamRunner, ScoreRunner


@pytest.fixture
def turn_at_wait(monkeypatch):
    """(lane, list): whether the lane's turn was held each time a runner waited for a call's outputs."""
    lane, held = Lane("cpu", 512), []
    wait = Pending.result

    def observed(self):
        held.append(lane.turn.locked())
        return wait(self)

    monkeypatch.setattr(Pending, "result", observed)
    return lane, held


def test_the_score_runner_waits_for_outputs_outside_the_turn(demo_artifacts, turn_at_wait):
    lane, held = turn_at_wait
    request = protocol.ScoreRequest("r", 100.0, protocol.pack_ids(list(range(1, 12))), (5, 6), (3, 4), 2)
    results = ScoreRunner(load_nodes(demo_artifacts).score).run(protocol.ScoreBatch(1, "int32", (request,)), [0], lane)
    assert results[0].status == protocol.Status.OK
    assert held == [False]


def test_the_beam_runner_waits_for_outputs_outside_the_turn(beam_artifacts, turn_at_wait):
    lane, held = turn_at_wait
    nodes = load_nodes(beam_artifacts)
    assert len(lane.token_buffer) >= max_staged_tokens(nodes.manifest.bounds)
    request = protocol.BeamRequest("r", 100.0, protocol.pack_ids([5, 9, 2, 7]))
    results = BeamRunner(nodes.beam).run(protocol.BeamBatch(1, "int32", 2, 2, 1, (request,)), [0], lane)
    assert results[0].status == protocol.Status.OK
    assert held == [False]
