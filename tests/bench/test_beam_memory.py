"""bench/harness/memory.py and the beam benchmark's batched phase: a call's rise of the resident set is measured, and a batch
size whose projected memory does not fit what the machine has free is skipped and named, not run into the OOM killer."""

from __future__ import annotations

import pytest
import torch

from bench import beam_node
from bench.harness import memory
from worker.runtime.allocator import release_free_memory

MIB = 2**20


def test_a_call_that_touches_memory_raises_the_resident_set_by_about_that_much():
    release_free_memory()  # an earlier test's freed heap would serve this call without new pages
    seconds, value, rise = memory.measured_call(lambda: float(torch.ones(64 * MIB).sum()))  # 256 MiB, every page
    assert value == 64 * MIB and seconds > 0
    if rise is None:
        pytest.skip("this kernel does not let a process reset its resident peak (/proc/self/clear_refs)")
    assert 200 * MIB <= rise <= 1024 * MIB


def test_a_projection_scales_the_measured_rise_to_the_batch_and_says_why_it_does_not_fit():
    gib = memory.GIB
    assert memory.fits(6 * gib, 1, 2, 20 * gib) == (True, "")
    fit, why = memory.fits(6 * gib, 1, 4, 20 * gib)
    assert not fit and why == "needs about 24.0 GiB (4 prompts from 1's rise of 6.0 GiB), 20.0 GiB available"
    assert memory.fits(10 * gib, 2, 4, 23 * gib)[0] and not memory.fits(10 * gib, 2, 4, 22 * gib)[0]  # share 0.9
    assert memory.fits(None, 1, 4, 1) == (True, "") and memory.fits(6 * gib, 1, 4, None) == (True, "")


class Stand:
    """Contenders whose calls return their name and batch size (run_batched only asks for batch(prompts)[name])."""

    def __init__(self, names=("ours", "ct2")):
        self.names, self.called = names, []

    def batch(self, prompts):
        def call(name):
            self.called.append((name, len(prompts)))
            return name, len(prompts)
        return {name: (lambda name=name: call(name)) for name in self.names}


def test_the_batched_phase_projects_from_the_last_measured_call_and_skips_what_would_not_fit(monkeypatch):
    gib = memory.GIB
    batched_rises = {("ours", 2): 1.5 * gib, ("ours", 4): 3 * gib, ("ct2", 2): 10 * gib}

    def measured(fn):
        value = fn()
        return 1.0, value, batched_rises[value]

    monkeypatch.setattr(memory, "available", lambda: 20 * gib)
    monkeypatch.setattr(memory, "measured_call", measured)
    stand = Stand(("ours", "hf", "ct2"))
    # single calls' rises: hf's 12 GiB is already too much for 2 prompts; ct2's 2 GiB fell short (it reused freed
    # heap), its call of 2 prompts says 10
    seconds, outputs, skipped = beam_node.run_batched(stand, [torch.zeros(4)] * 4,
                                                      {"ours": (4, 2), "hf": (2,), "ct2": (2, 4)},
                                                      {"ours": 1 * gib, "hf": 12 * gib, "ct2": 2 * gib})
    assert stand.called == [("ours", 2), ("ours", 4), ("ct2", 2)]
    assert set(seconds) == {("ours", 2), ("ours", 4), ("ct2", 2)}
    assert [(o["name"], o["prompts"]) for o in outputs] == [("ours", [0, 1]), ("ours", [0, 1, 2, 3]),
                                                           ("ct2", [0, 1])]
    assert skipped == {("hf", 2): "needs about 24.0 GiB (2 prompts from 1's rise of 12.0 GiB), 20.0 GiB available",
                       ("ct2", 4): "needs about 20.0 GiB (4 prompts from 2's rise of 10.0 GiB), 20.0 GiB available"}
    sides = beam_node.summary({"ours": 1.0, "hf": 3.0, "ct2": 2.0}, seconds)
    assert sorted(sides["ct2"]["requests_per_s_by_batch"]) == [1, 2] and sides["hf"]["best_batch"] == 1


def test_each_warm_up_call_starts_from_a_trimmed_heap_and_records_its_rise(monkeypatch):
    events = []
    monkeypatch.setattr(beam_node, "release_free_memory", lambda: events.append("trim"))

    def measured(fn):
        name, size = fn()
        events.append(name)
        return 1.0, (name, size), {"ours": 3 * MIB, "ct2": 7 * MIB}[name]

    monkeypatch.setattr(memory, "measured_call", measured)
    assert beam_node.warm_up(Stand(), torch.zeros(4)) == {"ours": 3 * MIB, "ct2": 7 * MIB}
    assert events == ["trim", "ours", "trim", "ct2"]


def test_prompts_that_only_one_float32_call_ran_are_named_unchecked():
    def out(name, prompts):
        return {"name": name, "prompts": prompts, "value": None}
    singles = [out("ours", [0]), out("hf", [0]), out("ours", [1]), out("hf", [1])]
    batched = [out("ours", [0, 1]), out("ours", [0, 1, 2, 3]), out("ours_bf16", [0, 1, 2, 3])]
    assert beam_node.unchecked(singles + batched) == [2, 3]  # our bf16 node is not held to float32 parity
    assert beam_node.unchecked(singles + batched + [out("ct2", [0, 1, 2, 3])]) == []
