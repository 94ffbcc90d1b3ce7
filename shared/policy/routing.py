"""Cache-aware placement: a batch goes where its prefix's keys/values already are, unless that misses
its deadline.

Each worker keeps the prefixes it computed lately (worker/prefix_cache.py), so a repeated context is
only cheap on the worker that saw it. `route` chooses, in order:
  1. the worker that most recently got this prefix (`RecentHolders`), if it has a free slot and its
     predicted finish is in time;
  2. else the prefix's owners on a consistent-hash ring over the workers (`Ring`: 64 points each),
     clockwise from the prefix's point, skipping those over the load bound (consistent hashing with
     bounded loads: at most ceil(load_factor x (batches in flight + 1) / workers) batches each) and
     those that would finish late; adding or losing a worker moves only the prefixes it owns;
  3. else the usual least-busy worker (batching.least_busy).
Pure: the caller passes the time and the deadline test, as for every policy here.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

from shared.policy.batching import Worker, least_busy

K = TypeVar("K", bound=Worker)

RING_POINTS = 64
"""Points per worker on the ring: each owns about 1/n of the prefixes, give or take ~10 %."""
LOAD_FACTOR = 1.25
"""How far above the mean of batches in flight a prefix's owner may be and still get it."""


def prefix_key(ids: Sequence[int]) -> int:
    """A prefix's point on the ring: 64 bits of BLAKE2b over its token ids (little-endian int64)."""
    return _point(struct.pack(f"<{len(ids)}q", *ids))


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Ring:
    """Points of the workers named `names`, sorted; a key belongs to the first point at or after it."""

    points: tuple[tuple[int, str], ...]

    @staticmethod
    @lru_cache(maxsize=64)
    def of(names: tuple[str, ...], points_each: int = RING_POINTS) -> Ring:
        return Ring(tuple(sorted((_point(f"{name}#{i}".encode()), name) for name in names for i in range(points_each))))

    def owners(self, key: int) -> list[str]:
        """Every worker once, in ring order clockwise from `key` (its owner first)."""
        start = next((i for i, (point, _) in enumerate(self.points) if point >= key), 0)
        seen: dict[str, None] = {}
        for i in range(len(self.points)):
            seen.setdefault(self.points[(start + i) % len(self.points)][1])
        return list(seen)


@dataclass
class RecentHolders:
    """Which worker got each prefix last: at most `capacity` prefixes, each for `memory_s` seconds."""

    capacity: int = 65536
    memory_s: float = 600.0
    _sent: OrderedDict[int, tuple[str, float]] = field(default_factory=OrderedDict)

    def get(self, key: int, now_s: float) -> str | None:
        held = self._sent.get(key)
        if held is None or now_s - held[1] > self.memory_s:
            return None
        return held[0]

    def record(self, key: int, name: str, now_s: float) -> None:
        self._sent[key] = (name, now_s)
        self._sent.move_to_end(key)
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)


def load_bound(workers: Sequence[Worker], load_factor: float = LOAD_FACTOR) -> int:
    """The most batches in flight a worker may have for a prefix's batch to be sent to it."""
    total = sum(len(w.in_flight) for w in workers)
    return math.ceil(load_factor * (total + 1) / max(1, len(workers)))


def route(key: int | None, workers: Mapping[str, K], now_s: float, max_inflight_batches: int,
          in_time: Callable[[K], bool], recent: RecentHolders, load_factor: float = LOAD_FACTOR) -> K | None:
    """Where a batch whose prefix is `key` goes (None: every slot is taken); see the module's order.
    `in_time(worker)`: the batch sent there now would finish by its deadline. A keyless batch (no
    shared prefix) goes to the least busy worker. The choice is recorded in `recent`."""
    free = {name: w for name, w in workers.items() if len(w.in_flight) < max_inflight_batches}
    if not free:
        return None
    if key is None:
        return least_busy(free.values(), now_s, max_inflight_batches)
    bound = load_bound(list(workers.values()), load_factor)
    holder = recent.get(key, now_s)
    preferred = [holder] if holder in free else []
    preferred += [name for name in Ring.of(tuple(sorted(workers))).owners(key)
                  if name in free and name != holder and len(free[name].in_flight) < bound]
    name = next((n for n in preferred if in_time(free[n])), None)
    chosen = free[name] if name is not None else least_busy(free.values(), now_s, max_inflight_batches)
    recent.record(key, name or next(n for n, w in free.items() if w is chosen), now_s)
    return chosen
