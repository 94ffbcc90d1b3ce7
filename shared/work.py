"""What a piece of work costs, in tokens, answered in one place: `WorkSize`.

A scoring request (or one chunk of it) is a shared prefix sent once plus one suffix per sample
(no prefix: the samples go whole). Some of its leading tokens may already have keys/values where
it runs, so they are sent but never computed: that is `reused`, one notion whatever holds the rows
(today the deployment's static prefix, cached in the package; a cache of recent prefixes would be
another `Reuse`). Everything that counts tokens asks a WorkSize: the gateway's job and the
simulator's (queue budget, batch packing, latency predictions), the wire codec and the worker's
bounds check (what was sent), the node's layout (what it computes and reports as cached).

A beam-search prompt is a WorkSize too: one whole "sample", run at `beams` beams.
Pure Python: no numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from shared.bounds import ScoreShape
from shared.prefix import prefix_keys


class Reuse(Protocol):
    """Where keys/values of leading tokens already exist: how many of `ids`' leading tokens a
    request need not compute (a request must compute at least its last token of every sample);
    `shared`: ids are a shared prefix (else one whole unshared sample)."""

    def reused(self, ids: Sequence[int], every_sample_goes_on: bool, shared: bool = True) -> int: ...


@dataclass(frozen=True)
class StaticPrefix:
    """The deployment's static prefix (the template header's tokens), whose keys/values the score
    package holds: a sample, or a shared prefix, that starts with all its tokens reuses them."""

    ids: tuple[int, ...] = ()

    def reused(self, ids: Sequence[int], every_sample_goes_on: bool, shared: bool = True) -> int:
        """len(self.ids) when `ids` start with them and either go on after them or every sample goes
        on after `ids` (a sample must not end inside the static prefix: its last token's output is
        computed); else 0."""
        n = len(self.ids)
        if n and len(ids) >= n and tuple(ids[:n]) == self.ids and (len(ids) > n or every_sample_goes_on):
            return n
        return 0


NO_REUSE = StaticPrefix()


@dataclass(frozen=True)
class HeldPrefixes:
    """The prefixes a worker reports holding in its prefix cache (worker/prefix_cache.py), as
    (prefix_key, tokens) pairs (shared/prefix.prefix_key), over the static prefix: a request
    whose shared prefix starts with one of them reuses the longest (the last token of a prefix every
    sample ends in is computed), else what the static prefix gives. Unshared samples reuse only the
    static prefix (the node reads cached rows under shared prefixes: worker/runtime/layout.py)."""

    held: frozenset[tuple[int, int]] = frozenset()
    static: StaticPrefix = NO_REUSE

    def reused(self, ids: Sequence[int], every_sample_goes_on: bool, shared: bool = True) -> int:
        if not shared:
            return self.static.reused(ids, every_sample_goes_on, shared)
        limit = len(ids) if every_sample_goes_on else len(ids) - 1
        keys = prefix_keys(ids, (n for n in self._lengths if 0 < n <= limit))
        for n in sorted(keys, reverse=True):
            if (keys[n], n) in self.held:
                return max(n, self.static.reused(ids, every_sample_goes_on))
        return self.static.reused(ids, every_sample_goes_on)

    @cached_property
    def _lengths(self) -> frozenset[int]:
        return frozenset(n for _, n in self.held)


@dataclass(frozen=True)
class WorkSize:
    """Tokens one request (or chunk) sends, computes and reuses (each count computed once: the
    policy asks them on every queue and batch decision)."""

    prefix_len: int
    """Tokens of the shared prefix, sent and computed once (0: every sample goes whole)."""
    suffix_lens: tuple[int, ...]
    """Each sample's tokens after the prefix (whole samples when prefix_len is 0)."""
    reused_tokens: int = 0
    """Sent tokens whose keys/values already exist where the work runs: never computed."""
    beams: int = 0
    """Beam search: the beams its one prompt runs at (0: scoring)."""

    @classmethod
    def of(cls, samples: Sequence[Sequence[int]], prefix_len: int = 0, reuse: Reuse = NO_REUSE) -> WorkSize:
        """Whole samples' token ids with their first `prefix_len` shared; `reuse` says which leading
        tokens need no computing (of the shared prefix once, else of each sample)."""
        suffix_lens = tuple(len(s) - prefix_len for s in samples)
        if prefix_len:
            reused = reuse.reused(samples[0][:prefix_len], all(suffix_lens))
        else:
            reused = sum(reuse.reused(s, False, shared=False) for s in samples)
        return cls(prefix_len, suffix_lens, reused)

    @classmethod
    def prompt(cls, tokens: int, beams: int) -> WorkSize:
        """A beam-search prompt of `tokens` tokens at `beams` beams."""
        return cls(0, (tokens,), 0, beams)

    @property
    def samples(self) -> int:
        return len(self.suffix_lens)

    @cached_property
    def prompt_tokens(self) -> int:
        """Tokens submitted: every sample whole (its prefix included)."""
        return self.samples * self.prefix_len + sum(self.suffix_lens)

    @cached_property
    def sent_tokens(self) -> int:
        """Tokens on the wire: the shared prefix once, then each suffix (what max_tokens_per_batch and
        the queue budget count)."""
        return self.prefix_len + sum(self.suffix_lens)

    @cached_property
    def computed_tokens(self) -> int:
        """Tokens the node computes: sent, less the reused ones."""
        return self.sent_tokens - self.reused_tokens

    @cached_property
    def cached_tokens(self) -> int:
        """Submitted tokens not computed (a shared prefix's repeats and the reused tokens): what an
        answer reports as cached."""
        return self.prompt_tokens - self.computed_tokens

    @property
    def batch_items(self) -> int:
        """B of the latency model (shared/latency_model.py): samples, or beams."""
        return self.beams or self.samples

    @cached_property
    def latency_tokens(self) -> int:
        """Tokens summed over the latency model's items (L = latency_tokens / batch_items): computed
        tokens for scoring, the prompt once per beam for beam search."""
        return self.beams * self.sent_tokens if self.beams else self.computed_tokens

    @property
    def longest_sample(self) -> int:
        return self.prefix_len + max(self.suffix_lens, default=0)

    @property
    def shortest_sample(self) -> int:
        return self.prefix_len + min(self.suffix_lens, default=0)

    @classmethod
    def groups(cls, prefix_lens: Sequence[int], suffix_lens: Sequence[int], group_sizes: Sequence[int]) -> list[WorkSize]:
        """The works of a packed batch: group r is prefix_lens[r] then its group_sizes[r] suffixes
        (the node's and the wire's layout); nothing is reused (that is the layout's to find)."""
        works, start = [], 0
        for prefix_len, size in zip(prefix_lens, group_sizes):
            works.append(cls(prefix_len, tuple(suffix_lens[start:start + size])))
            start += size
        return works

    def chunk_bounds(self, max_samples_per_batch: int, max_tokens_per_batch: int) -> list[tuple[int, int]]:
        """(start, end) of each chunk when the samples, in order, are cut greedily into batches of at
        most `max_samples_per_batch` samples and `max_tokens_per_batch` sent tokens; every chunk carries the shared prefix
        again (counted once in it), so its suffixes get what the prefix leaves of the budget. The cut
        is chunk_bounds below; a single sample always fits."""
        return chunk_bounds(self.suffix_lens, max_samples_per_batch, max_tokens_per_batch - self.prefix_len)

    def shape(self, labels: int = 0, top_k: int = 0) -> ScoreShape:
        """This work as the score bounds count it (shared/bounds.py)."""
        return ScoreShape(samples=self.samples, longest_sample=self.longest_sample, prefix_tokens=self.prefix_len,
                          tokens=self.sent_tokens, labels=labels, top_k=top_k)


POLICY_COUNTS = {"samples": "samples", "tokens": "sent_tokens", "batch_items": "batch_items",
                 "latency_tokens": "latency_tokens"}
"""What shared/policy reads of queued work (its Work protocol) -> the WorkSize answer it is."""


def counted_by_work(cls: type) -> type:
    """Class decorator: a job class holding `work: WorkSize` answers shared/policy's counts from it
    (shared/policy/job.py's Job, the gateway's and the simulator's), so no one keeps counts of its own."""
    for name, answer in POLICY_COUNTS.items():
        setattr(cls, name, property(lambda self, answer=answer: getattr(self.work, answer),
                                    doc=f"work.{answer} (shared/work.py)"))
    return cls


def batch_shape(works: Sequence[WorkSize], labels: int, top_k: int = 0) -> ScoreShape:
    """A batch of works as the score bounds count it: samples and sent tokens summed, the longest
    sample and prefix, the batch's distinct labels."""
    return ScoreShape(samples=sum(w.samples for w in works), longest_sample=max((w.longest_sample for w in works),
                                                                                default=0),
                      prefix_tokens=max((w.prefix_len for w in works), default=0),
                      tokens=sum(w.sent_tokens for w in works), labels=labels, top_k=top_k)


def chunk_bounds(lengths: Sequence[int], max_samples_per_batch: int, max_tokens_per_batch: int) -> list[tuple[int, int]]:
    """[start, end) sample ranges of a scoring request cut into consecutive chunks that each fit one
    batch (at most `max_samples_per_batch` samples and `max_tokens_per_batch` tokens; a longer sample stays alone)."""
    chunks, start, tokens = [], 0, 0
    for i, length in enumerate(lengths):
        if i > start and (i - start == max_samples_per_batch or tokens + length > max_tokens_per_batch):
            chunks.append((start, i))
            start, tokens = i, 0
        tokens += length
    if lengths:
        chunks.append((start, len(lengths)))
    return chunks
