"""Shared token prefixes of a scoring request: pure functions used by the gateway, the worker and the build.

Sharing is exact because it is decided on the token ids that would have been computed anyway: a
request's samples are split into their longest common prefix plus one suffix each, and the model
attends from every suffix to the prefix's keys/values exactly as it would inside the full sample.
The deployment's static prefix (the literal text before the first field of `[score] prompt_template`)
is reused only by samples whose ids really start with its tokens.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Continuations appended to a template header to find the tokens that do not depend on what follows
# (a BPE merge across the boundary, or a trailing special token, changes only the last few).
_CONTINUATIONS = ("a", "Z", " 1", "\n", "{", "\u4e2d")


@dataclass(frozen=True)
class SharingRule:
    """When a request's samples share their common prefix ([score] min_shared_prefix_tokens and
    bounds.max_prefix_tokens): the gateway decides with it on token ids, the simulator on a trace's
    lengths, so both send the same work."""

    min_shared_prefix_tokens: int
    max_prefix_tokens: int

    def prefix_len(self, common_len: int, samples: int) -> int:
        """Tokens the samples will share (0: sent unshared): their common prefix `common_len` when there
        are two or more samples and it is within [min_shared_prefix_tokens, max_prefix_tokens]. A longer
        one is never cut."""
        return (common_len if samples >= 2 and self.min_shared_prefix_tokens <= common_len <= self.max_prefix_tokens
                else 0)


NEVER_SHARE = SharingRule(1, 0)


def longest_common_prefix(samples: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix every sample starts with (0 for no samples)."""
    if not samples:
        return 0
    first, length = samples[0], min(len(s) for s in samples)
    for other in samples[1:]:
        i = 0
        while i < length and other[i] == first[i]:
            i += 1
        length = i
        if not length:
            break
    return length


@functools.cache
def template_fields(template: str) -> frozenset[str]:
    """The field names a str.format template uses ({text}, {query}); parsed once per template."""
    return frozenset(field for _, field, _, _ in string.Formatter().parse(template) if field)


def template_header(template: str | None) -> str:
    """The literal text of a str.format template before its first field ('{{' read as '{')."""
    header = []
    for literal, field, _, _ in string.Formatter().parse(template or ""):
        header.append(literal)
        if field is not None:
            return "".join(header)
    return ""  # no field: the whole text is one constant sample, not a prefix


def stable_prefix_ids(encode: Callable[[str], list[int]], header: str) -> list[int]:
    """The tokens of `header` that stay the same whatever text follows it: the common prefix of the
    encodings of header + several different continuations (`encode` is the serving tokenizer's call)."""
    if not header:
        return []
    encodings = [encode(header + c) for c in _CONTINUATIONS]
    return list(encodings[0][: longest_common_prefix(encodings)])


def prefix_key(ids: Sequence[int]) -> int:
    """A prefix's point on the ring: 64 bits of BLAKE2b over its token ids (little-endian int64)."""
    return hash64(struct.pack(f"<{len(ids)}q", *ids))


def prefix_keys(ids: Sequence[int], lengths: Iterable[int]) -> dict[int, int]:
    """prefix_key(ids[:n]) for each n in `lengths` (each at most len(ids)), in one pass over the ids:
    a worker may hold hundreds of prefix lengths, and hashing each from the start would cost
    hundreds of hashes of the whole prefix per request."""
    data, hasher, done, keys = struct.pack(f"<{len(ids)}q", *ids), hashlib.blake2b(digest_size=8), 0, {}
    for n in sorted(set(lengths)):
        hasher.update(data[done * 8: n * 8])
        done = n
        keys[n] = int.from_bytes(hasher.copy().digest(), "little")
    return keys


def hash64(data: bytes) -> int:
    """64 bits of BLAKE2b: a point on the routing ring (prefixes and worker names hash alike)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
