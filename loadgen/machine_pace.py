"""A machine whose speed changes with time: slow and fast spells that no schedule can move.

The simulator's per-batch jitter (sim_world.Jitter) gives the k-th batch sent the k-th factor, so
which batch is slowed depends on the schedule, and no bound can know a schedule's service times
before it is chosen. Noise from a shared machine is a property of time, not of batches: here time
is cut into slots of `slot_ms`, slot n runs at 1 / factor(n) of the latency model's speed (factor
n: a seeded draw from the measured ratios, the same whatever ran before), and a batch's compute
progresses at the speed of each slot it spans. A batch that needs W ms of the model's time started
at t ends at finish_ms(t, W); in [a, b] a worker can do work_ms(a, b) ms of the model's time, the
same for every schedule: what lets loadgen/bound.py know the realised service times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np


class MachinePace:
    """Speed factors by time slot (ms of compute / ms of the model's time), seeded, drawn lazily."""

    def __init__(self, ratios: Sequence[float], seed: int, slot_ms: float) -> None:
        if slot_ms <= 0:
            raise ValueError(f"MachinePace needs slot_ms > 0, got {slot_ms}")
        if not ratios or min(ratios) <= 0:
            raise ValueError("MachinePace needs at least one ratio, every one > 0 (compute cannot take no time)")
        self.ratios = tuple(ratios)
        self.seed = seed
        self.slot_ms = slot_ms
        self._factors: dict[int, float] = {}

    def factor(self, slot: int) -> float:
        """Slot `slot`'s factor (slot n covers [n, n + 1) x slot_ms): its own seeded draw."""
        if slot not in self._factors:
            self._factors[slot] = random.Random(f"{self.seed}:{slot}").choice(self.ratios)
        return self._factors[slot]

    def finish_ms(self, start_ms: float, model_ms: float) -> float:
        """When a batch needing `model_ms` of the model's time, started at `start_ms`, ends."""
        at, left = start_ms, model_ms
        while left > 0:
            slot = math.floor(at / self.slot_ms)
            factor, slot_end = self.factor(slot), (slot + 1) * self.slot_ms
            if (slot_end - at) / factor >= left:
                return at + left * factor
            left -= (slot_end - at) / factor
            at = slot_end
        return at

    def work_ms(self, starts_ms: np.ndarray, ends_ms: np.ndarray) -> np.ndarray:
        """The model's ms one worker can compute in each [starts_ms[i], ends_ms[j]] (an outer
        difference, shape [len(starts), len(ends)]; negative where the end is before the start)."""
        return self.done_by(ends_ms)[None, :] - self.done_by(starts_ms)[:, None]

    def done_by(self, at_ms: np.ndarray) -> np.ndarray:
        """The model's ms one worker computes from 0 to each of `at_ms` (negative before 0)."""
        at_ms = np.asarray(at_ms, dtype=float)
        if at_ms.size == 0:
            return at_ms
        first, last = math.floor(at_ms.min() / self.slot_ms), math.floor(at_ms.max() / self.slot_ms)
        slots = np.arange(min(first, 0), max(last, 0) + 1)
        speed = np.array([1.0 / self.factor(int(n)) for n in slots]) * self.slot_ms  # model ms per slot
        before = np.concatenate(([0.0], np.cumsum(speed)))  # model ms from slots[0]'s start to each slot's
        before -= before[-slots[0]]  # ... measured from time 0 (slot 0's start)
        slot = np.floor(at_ms / self.slot_ms).astype(int)
        into = at_ms - slot * self.slot_ms
        k = slot - slots[0]
        return before[k] + into / np.array([self.factor(int(n)) for n in slot])
