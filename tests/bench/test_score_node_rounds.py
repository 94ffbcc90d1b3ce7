"""bench/score_node.py's repeated rounds: every contender runs `rounds` times per request, the order rotated
from round to round, each request counted at its median round, outputs taken from its first round; the page
faults of every call are recorded beside its time."""

from __future__ import annotations

import mmap
import statistics

import pytest

from bench import score_node


class Recorded:
    """Contenders whose calls are logged (name, request, round) and return which call they were."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def for_request(self, samples) -> dict:
        request = samples[0]
        return {name: (lambda name=name: self._call(name, request)) for name in ("ours", "openvino", "ct2")}

    def _call(self, name: str, request: int) -> tuple[str, int, int]:
        count = sum(1 for n, r in self.calls if (n, r) == (name, request))
        self.calls.append((name, request))
        return name, request, count


@pytest.mark.parametrize("rounds", [1, 3])
def test_every_contender_runs_each_round_in_rotated_order(rounds):
    contenders = Recorded()
    seconds, outputs, by_round, faults_by_round = score_node.time_requests(contenders, [[0], [1]], rounds)
    assert len(contenders.calls) == 2 * 3 * rounds
    firsts = [contenders.calls[i][0] for i in range(0, len(contenders.calls), 3)]
    assert firsts == ["ours", "openvino", "ct2", "ours", "openvino", "ct2"][: 2 * rounds]  # one turn per round
    assert [out["ours"] for out in outputs] == [("ours", 0, 0), ("ours", 1, 0)]  # each request's first round
    for name in ("ours", "openvino", "ct2"):
        assert [len(rows) for rows in by_round[name]] == [rounds, rounds]
        assert [len(rows) for rows in faults_by_round[name]] == [rounds, rounds]
        assert all(isinstance(f, int) and f >= 0 for rows in faults_by_round[name] for f in rows)
        assert seconds[name] == pytest.approx(sum(statistics.median(r) for r in by_round[name]) / 2)


def test_a_call_that_maps_fresh_pages_in_is_counted_with_them():
    pages = 256

    def touch():
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as memory:  # anonymous: the kernel maps each page at first write
            for offset in range(0, len(memory), mmap.PAGESIZE):
                memory[offset] = 1

    faults = {}
    assert score_node.counting_faults(lambda: "value", faults, "idle")() == "value"
    score_node.counting_faults(touch, faults, "touch")()
    assert faults["touch"] >= pages > faults["idle"]
