"""bench/score_node.py's repeated rounds: every contender runs once untimed, then `rounds` times per request,
the order rotated from round to round, each request counted at its median round, outputs taken from its first
timed round; the page faults of every call are recorded beside its time."""

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
def test_every_contender_runs_each_round_in_rotated_order_after_one_untimed_round(rounds):
    contenders = Recorded()
    timed = score_node.time_requests(contenders, [[0], [1]], rounds)
    assert contenders.calls[:3] == [("ours", 0), ("openvino", 0), ("ct2", 0)]  # the warm-up, on the first request
    assert set(timed.warm_up_faults) == {"ours", "openvino", "ct2"}
    calls = contenders.calls[3:]
    assert len(calls) == 2 * 3 * rounds
    firsts = [calls[i][0] for i in range(0, len(calls), 3)]
    assert firsts == ["ours", "openvino", "ct2", "ours", "openvino", "ct2"][: 2 * rounds]  # one turn per round
    assert [out["ours"] for out in timed.outputs] == [("ours", 0, 1), ("ours", 1, 0)]  # first timed rounds
    for name in ("ours", "openvino", "ct2"):
        assert [len(rows) for rows in timed.by_round[name]] == [rounds, rounds]
        assert [len(rows) for rows in timed.faults_by_round[name]] == [rounds, rounds]
        assert all(isinstance(f, int) and f >= 0 for rows in timed.faults_by_round[name] for f in rows)
        assert timed.seconds[name] == pytest.approx(sum(statistics.median(r) for r in timed.by_round[name]) / 2)


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
