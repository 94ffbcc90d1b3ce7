"""bench/memory.py and the beam benchmark's batched phase: a call's rise of the resident set is measured, and a batch
size whose projected memory does not fit what the machine has free is skipped and named, not run into the OOM killer."""

from __future__ import annotations

import torch

from bench import beam_node, memory

MIB = 2**20


def test_a_call_that_touches_memory_raises_the_resident_set_by_about_that_much():
    memory.return_freed_memory()  # an earlier test's freed heap would serve this call without new pages
    seconds, value, rise = memory.measured_call(lambda: float(torch.ones(64 * MIB).sum()))  # 256 MiB, every page
    assert value == 64 * MIB and seconds > 0
    assert 200 * MIB <= rise <= 1024 * MIB


def test_a_projection_fits_within_the_share_of_free_memory_and_says_why_not():
    gib = memory.GIB
    assert memory.fits(6 * gib, 2, 20 * gib) == (True, "")
    fit, why = memory.fits(6 * gib, 4, 20 * gib)
    assert not fit and why == "needs about 24.0 GiB (4 x its single call's rise of 6.0 GiB), 20.0 GiB available"
    assert memory.fits(None, 4, 1) == (True, "") and memory.fits(6 * gib, 4, None) == (True, "")


class Stand:
    """Contenders whose calls return their name and batch size (run_batched only asks for batch(prompts)[name])."""

    def __init__(self):
        self.called = []

    def batch(self, prompts):
        def call(name):
            self.called.append((name, len(prompts)))
            return name, len(prompts)
        return {name: (lambda name=name: call(name)) for name in ("ours", "ct2")}


def test_the_batched_phase_skips_a_size_that_would_not_fit_and_keeps_the_rest(monkeypatch):
    gib = memory.GIB
    monkeypatch.setattr(memory, "available", lambda: 20 * gib)
    stand = Stand()
    seconds, outputs, skipped = beam_node.run_batched(stand, [torch.zeros(4)] * 4, {"ours": (2, 4), "ct2": (2, 4)},
                                                      {"ours": 1 * gib, "ct2": 6 * gib})
    assert stand.called == [("ours", 2), ("ours", 4), ("ct2", 2)]
    assert set(seconds) == {("ours", 2), ("ours", 4), ("ct2", 2)}
    assert [(o["name"], o["prompts"], o["value"]) for o in outputs] == [
        ("ours", [0, 1], ("ours", 2)), ("ours", [0, 1, 2, 3], ("ours", 4)), ("ct2", [0, 1], ("ct2", 2))]
    assert skipped == {"ct2 x4": "needs about 24.0 GiB (4 x its single call's rise of 6.0 GiB), 20.0 GiB available"}
    sides = beam_node.summary({"ours": 1.0, "ct2": 2.0}, seconds)
    assert sorted(sides["ct2"]["requests_per_s_by_batch"]) == [1, 2]


def test_singles_record_each_contenders_largest_rise(monkeypatch):
    rises = iter([3 * MIB, 5 * MIB, 7 * MIB, 2 * MIB])
    monkeypatch.setattr(memory, "measured_call", lambda fn: (1.0, fn(), next(rises)))
    seconds, outputs, found = beam_node.run_singles(Stand(), [torch.zeros(4)] * 2)
    assert seconds == {"ours": 1.0, "ct2": 1.0} and len(outputs) == 4
    # prompt 0 runs ours then ct2 (3, 5 MiB); prompt 1 rotates the order: ct2 then ours (7, 2 MiB)
    assert found == {"ours": 3 * MIB, "ct2": 7 * MIB}
