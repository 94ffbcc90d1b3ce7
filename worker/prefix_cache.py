"""A byte-bounded cache of prefix keys/values across requests, in one worker.

What it holds: for a token prefix (a request's shared prefix, or a leading part of one), the keys and
values [layers, P, Hkv, D] every layer computed for its P tokens, so that a later request starting
with the same tokens reads them instead of computing them (the node takes them as rows without
queries, as it takes the static prefix).

Rules, each for a reason:
  - The key is a SHA-256 of the artifacts' build key and the prefix's token ids (little-endian
    int64): a rebuild never serves an old entry. The full ids are kept and compared on every hit,
    so even a digest collision can never return another prefix's keys/values.
  - A prefix is inserted on its second sighting (or at once when the caller says it will be reused,
    e.g. a request split across batches): one-off contexts do not flush useful ones. Sightings are
    remembered for at most `max_sightings` digests (least recent forgotten first).
  - Eviction keeps the entries with the most expected saving per byte: GreedyDual-Size-Frequency,
    priority = clock + hits x recompute cost / bytes, the lowest evicted first and the clock raised
    to its priority, so an entry not hit for a while ages out behind newer useful ones.
  - Pinned entries (the deployment's static prefix) are never evicted; they count against the budget.
  - The bytes held (keys, values and the kept ids) never exceed `budget_bytes`; an entry larger than
    what the pinned ones leave is refused.
  - One lock (`lock`) guards it: the worker's compute lanes plan and insert under it, the heartbeat
    reads `report()` under it. Hits hand out the held tensors themselves (never written in place, so
    an entry evicted while a batch reads it stays valid for that batch).
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from shared.prefix import prefix_key
from shared.protocol import PrefixCacheReport
from shared.work import StaticPrefix

ID_BYTES = 8
"""Bytes per kept token id (int64), counted against the budget with the keys and values."""

DEFAULT_MAX_SIGHTINGS = 4096


def token_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int64 bytes (what the digest covers)."""
    return struct.pack(f"<{len(ids)}q", *ids)


@dataclass
class Entry:
    """One cached prefix: its ids (compared on every hit) and its keys/values [layers, P, Hkv, D]."""

    ids: tuple[int, ...]
    keys: torch.Tensor
    values: torch.Tensor
    pinned: bool = False
    hits: int = 0
    priority: float = 0.0
    route_key: int = 0
    """shared/prefix.prefix_key of the ids: what the heartbeat reports the entry as."""

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + ID_BYTES * len(self.ids)


@dataclass(frozen=True)
class Hit:
    """The longest cached prefix of a lookup's ids: its length and keys/values [layers, P, Hkv, D]."""

    tokens: int
    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class CacheStats:
    """Counters since start (what /metrics exports) and the bytes held now."""

    hits: int = 0
    misses: int = 0
    insertions: int = 0
    evictions: int = 0
    refusals: int = 0
    """Inserts refused: the entry alone is larger than the budget the pinned entries leave."""
    bytes_held: int = 0
    hit_tokens: int = 0
    """Prompt tokens served from the cache (not computed)."""


@dataclass
class PrefixCache:
    """Prefix keys/values by SHA-256(build key, ids), at most `budget_bytes` held (0: off)."""

    budget_bytes: int
    build_key: bytes
    recompute_cost: Callable[[int], float] = float
    """What recomputing a prefix of n tokens costs (any unit; only ratios matter): the saving of a hit."""
    max_sightings: int = DEFAULT_MAX_SIGHTINGS
    stats: CacheStats = field(default_factory=CacheStats)
    _entries: dict[bytes, Entry] = field(default_factory=dict)
    _lengths: dict[int, int] = field(default_factory=dict)  # prefix length -> entries of that length
    _sightings: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    _clock: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def report(self) -> PrefixCacheReport:
        """What the heartbeat tells the gateways: the (prefix_key, tokens) held, the budget, the counters."""
        with self.lock:
            held = tuple((e.route_key, len(e.ids)) for e in self._entries.values())
            stats = self.stats
            return PrefixCacheReport(held=held, budget_bytes=self.budget_bytes, bytes_held=stats.bytes_held,
                                     hits=stats.hits, misses=stats.misses, insertions=stats.insertions,
                                     evictions=stats.evictions, hit_tokens=stats.hit_tokens)

    def __len__(self) -> int:
        return len(self._entries)

    def digest(self, ids: Sequence[int]) -> bytes:
        return self._digests(ids, [len(ids)])[len(ids)]

    def _digests(self, ids: Sequence[int], lengths: Sequence[int]) -> dict[int, bytes]:
        """Digest of ids[:n] for each n in `lengths`, in one pass over the ids."""
        hasher, done, out = hashlib.sha256(self.build_key), 0, {}
        data = token_bytes(ids)
        for n in sorted(lengths):
            hasher.update(data[done * ID_BYTES: n * ID_BYTES])
            done = n
            out[n] = hasher.copy().digest()
        return out

    def lookup(self, ids: Sequence[int]) -> Hit | None:
        """The longest cached prefix of `ids` (all of them or a leading part), counted as a hit, or
        None (a miss). Its ids are compared in full: a digest match alone never answers."""
        if not self.enabled:
            return None
        ids = tuple(ids)
        lengths = [n for n in self._lengths if n <= len(ids)]
        for n, key in sorted(self._digests(ids, lengths).items(), reverse=True):
            entry = self._entries.get(key)
            if entry is not None and entry.ids == ids[:n]:
                entry.hits += 1
                entry.priority = self._priority(entry)
                self.stats.hits += 1
                self.stats.hit_tokens += n
                return Hit(n, entry.keys, entry.values)
        self.stats.misses += 1
        return None

    def wants(self, ids: Sequence[int], reuse_expected: bool = False) -> bool:
        """Whether `ids`' keys/values should be inserted once computed: they are not held and either
        the caller expects them reused or this is (at least) their second sighting. Records the sighting."""
        if not self.enabled or not ids:
            return False
        key = self.digest(ids)
        held = self._entries.get(key)
        if held is not None and held.ids == tuple(ids):
            return False
        seen = key in self._sightings
        self._sightings[key] = None
        self._sightings.move_to_end(key)
        while len(self._sightings) > self.max_sightings:
            self._sightings.popitem(last=False)
        return reuse_expected or seen

    def insert(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor, pinned: bool = False) -> bool:
        """Hold keys/values [layers, len(ids), Hkv, D] of `ids`, evicting the entries with the least
        expected saving per byte until they fit; False (nothing changed) when they cannot fit."""
        if not self.enabled:
            return False
        ids = tuple(ids)
        if keys.shape[1] != len(ids) or values.shape != keys.shape:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must both be "
                             f"[layers, {len(ids)}, kv_heads, head_dim] for {len(ids)} ids")
        key = self.digest(ids)
        entry = Entry(ids, keys.detach().clone(), values.detach().clone(), pinned, route_key=prefix_key(ids))
        old = self._entries.get(key)
        room = self.budget_bytes - self._pinned_bytes(besides=old)
        if entry.nbytes > room:
            self.stats.refusals += 1
            return False
        if old is not None:
            self._remove(key)
        while self.stats.bytes_held + entry.nbytes > self.budget_bytes:
            self._evict_one()
        entry.priority = self._priority(entry)
        self._entries[key] = entry
        self._lengths[len(ids)] = self._lengths.get(len(ids), 0) + 1
        self.stats.bytes_held += entry.nbytes
        self.stats.insertions += 1
        self._sightings.pop(key, None)
        return True

    def _priority(self, entry: Entry) -> float:
        """GreedyDual-Size-Frequency: the clock plus (hits + 1) x recompute cost per byte."""
        return self._clock + (entry.hits + 1) * self.recompute_cost(len(entry.ids)) / entry.nbytes

    def _pinned_bytes(self, besides: Entry | None = None) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.pinned and e is not besides)

    def _evict_one(self) -> None:
        key, victim = min(((k, e) for k, e in self._entries.items() if not e.pinned), key=lambda kv: kv[1].priority)
        self._clock = victim.priority
        self._remove(key)
        self.stats.evictions += 1

    def _remove(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.stats.bytes_held -= entry.nbytes
        n = len(entry.ids)
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]


@dataclass(frozen=True)
class GroupPlan:
    """What the cache does for one group of a batch: the hit its prefix reads (None: computed from
    the static prefix or from scratch) and whether its prefix's rows are kept once computed."""

    hit: Hit | None
    insert: bool

    @property
    def hit_tokens(self) -> int:
        return self.hit.tokens if self.hit is not None else 0


def plan_batch(cache: PrefixCache, prefixes: Sequence[Sequence[int]], every_sample_goes_on: Sequence[bool],
               split: Sequence[bool], static: StaticPrefix) -> list[GroupPlan]:
    """Per group (its shared prefix's ids, whether all its samples go on after them, whether its
    request was split across batches): the longest held prefix that leaves every sample's last token
    to compute and reads more than the static prefix already gives, and whether to insert the prefix
    (its second sighting, or a split request: the other chunks will read it). Unshared groups
    (empty prefix) are left alone."""
    plans = []
    for ids, goes_on, was_split in zip(prefixes, every_sample_goes_on, split):
        if not ids or not cache.enabled:
            plans.append(GroupPlan(None, False))
            continue
        hit = cache.lookup(ids if goes_on else ids[:-1])
        if hit is not None and hit.tokens <= static.reused(ids, goes_on):
            hit = None  # the package's own static rows serve as much
        whole = hit is not None and hit.tokens == len(ids)
        plans.append(GroupPlan(hit, not whole and cache.wants(ids, reuse_expected=was_split)))
    return plans
