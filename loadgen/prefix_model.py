"""A model of a worker's prefix cache (worker/prefix_cache.py) without keys/values: which prefixes it
holds and its counters, for the simulator and the stand-in worker.

The same rules as the worker's cache, on whole prefixes named by a key (an exact match, where the
worker also serves the longest held leading part of a longer prefix): a prefix is inserted on its
second sighting, or at once when its request was split across batches (the other chunks read it);
sightings are remembered for `max_sightings` keys; eviction is GreedyDual-Size-Frequency with a
recompute cost and a size both proportional to the tokens, so the priority is the clock plus the
hits + 1, the lowest evicted first and the clock raised to it. The budget is in tokens (the worker's
bytes over its bytes per token: layers x 2 x kv heads x head dim x the dtype's bytes, plus 8 for the id).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from shared import protocol


@dataclass
class _Entry:
    tokens: int
    hits: int = 0
    priority: float = 0.0


@dataclass
class PrefixCacheModel:
    """Held prefixes by key, at most `budget_tokens` tokens (0: off), and the worker's counters."""

    budget_tokens: int
    max_sightings: int = 4096
    bytes_per_token: int = 1
    """What the report's bytes count per token held."""
    hits: int = 0
    misses: int = 0
    insertions: int = 0
    evictions: int = 0
    hit_tokens: int = 0
    tokens_held: int = 0
    _entries: dict[int, _Entry] = field(default_factory=dict)
    _sightings: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _clock: float = 0.0

    def holds(self, key: int) -> int:
        """Tokens held for the prefix `key` (0: not held)."""
        entry = self._entries.get(key)
        return entry.tokens if entry is not None else 0

    def serve(self, key: int, tokens: int, split: bool = False) -> int:
        """A batch group with prefix `key` of `tokens` tokens ran: the tokens it read from the cache
        (0: a miss, after which the prefix is inserted on its second sighting, or at once if split)."""
        if self.budget_tokens <= 0 or tokens <= 0:
            return 0
        entry = self._entries.get(key)
        if entry is not None:
            entry.hits += 1
            entry.priority = self._clock + entry.hits + 1
            self.hits, self.hit_tokens = self.hits + 1, self.hit_tokens + entry.tokens
            return entry.tokens
        self.misses += 1
        seen = key in self._sightings
        self._sightings[key] = None
        self._sightings.move_to_end(key)
        while len(self._sightings) > self.max_sightings:
            self._sightings.popitem(last=False)
        if (seen or split) and tokens <= self.budget_tokens:
            self._insert(key, tokens)
        return 0

    def _insert(self, key: int, tokens: int) -> None:
        while self.tokens_held + tokens > self.budget_tokens:
            victim = min(self._entries, key=lambda k: self._entries[k].priority)
            self._clock = self._entries[victim].priority
            self.tokens_held -= self._entries.pop(victim).tokens
            self.evictions += 1
        self._entries[key] = _Entry(tokens, 0, self._clock + 1)
        self._sightings.pop(key, None)
        self.tokens_held += tokens
        self.insertions += 1

    def report(self) -> protocol.PrefixCacheReport:
        """What a worker's heartbeat says of this cache."""
        return protocol.PrefixCacheReport(tuple((k, e.tokens) for k, e in self._entries.items()),
                                   self.budget_tokens * self.bytes_per_token, self.tokens_held * self.bytes_per_token,
                                   self.hits, self.misses, self.insertions, self.evictions, self.hit_tokens)
