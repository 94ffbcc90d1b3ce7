"""Shared token prefixes of a scoring request: pure functions used by the gateway, the worker and the build.

Sharing is exact because it is decided on the token ids that would have been computed anyway: a
request's samples are split into their longest common prefix plus one suffix each, and the model
attends from every suffix to the prefix's keys/values exactly as it would inside the full sample.
The deployment's static prefix (the literal text before the first field of `[score] prompt_template`)
is reused only by samples whose ids really start with its tokens.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

# Continuations appended to a template header to find the tokens that do not depend on what follows
# (a BPE merge across the boundary, or a trailing special token, changes only the last few).
_CONTINUATIONS = ("a", "Z", " 1", "\n", "{", "\u4e2d")


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


def static_prefix_len(sample: Sequence[int], static_ids: Sequence[int]) -> int:
    """len(static_ids) when the sample starts with them and has at least one token after, else 0."""
    n = len(static_ids)
    if n and len(sample) > n and list(sample[:n]) == list(static_ids):
        return n
    return 0


def shared_static_len(prefix: Sequence[int], static_ids: Sequence[int], every_sample_goes_on: bool) -> int:
    """Static-prefix tokens a shared prefix reuses: all len(static_ids) when the prefix starts with
    them and either goes on after them or every sample goes on after the prefix (a sample must not
    end inside the static prefix: its last token's output is computed); else 0."""
    n = len(static_ids)
    if n and len(prefix) >= n and list(prefix[:n]) == list(static_ids) and (len(prefix) > n or every_sample_goes_on):
        return n
    return 0


def computed_tokens(prefix: Sequence[int], suffixes: Sequence[Sequence[int]], static_ids: Sequence[int] = ()) -> int:
    """Tokens the score node computes for one request: its shared `prefix` once plus every suffix
    (prefix empty: the suffixes are the whole samples), less the static prefix `static_ids` where
    the node reuses it (shared_static_len; unshared: static_prefix_len per sample)."""
    if len(prefix):
        every_suffix = all(len(s) for s in suffixes)
        return len(prefix) - shared_static_len(prefix, static_ids, every_suffix) + sum(len(s) for s in suffixes)
    return sum(len(s) - static_prefix_len(s, static_ids) for s in suffixes)
