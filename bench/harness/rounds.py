"""Interleaved rounds of two sides: the spread of their per-round ratio, and what a figure inside it may claim.

A benchmark that runs side A and then side B once reads the machine's drift as a difference. Run
in interleaved rounds (A B, B A, A B, ...), each round gives one ratio; the rounds' range is the
spread. A difference whose spread holds no difference at all (a speedup range holding 1, a slowdown
range holding 0) is "within noise", never a goal met; a speedup above the work's own bound (the
FLOPs it saves) is noise too, and is claimed only up to that bound.
"""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict:
    """median, min, max and every round's value (in round order)."""
    if not values:
        raise ValueError("no rounds: a spread needs at least one round")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": list(values)}


def verdict(values: list[float], neutral: float, higher: str, lower: str) -> str:
    """`higher` when every round is above `neutral` (1 for a ratio, 0 for a relative change), `lower` when every
    round is below it, else "within noise" (the rounds disagree on the sign of the difference)."""
    if min(values) > neutral:
        return higher
    if max(values) < neutral:
        return lower
    return "within noise"


def speedup(values: list[float], bound: float) -> dict:
    """Per-round speedups (baseline seconds / ours) against the work's own bound (baseline FLOPs / ours): the
    spread, the verdict, and the speedup claimed: the median, never above the bound, none within noise."""
    found = verdict(values, 1.0, "faster", "slower")
    median = statistics.median(values)
    claimed = None if found == "within noise" else min(median, bound) if found == "faster" else median
    note = (f"the median {median:.4g}x is above the FLOP bound {bound:.4g}x: the excess is noise, claimed only up to "
            "the bound") if found == "faster" and median > bound else None
    return {**spread(values), "flop_bound": bound, "verdict": found, "claimed": claimed, "note": note}


def change(values: list[float]) -> dict:
    """Per-round relative changes (ours / baseline - 1): the spread and "slower", "faster" or "within noise"."""
    return {**spread(values), "verdict": verdict(values, 0.0, "slower", "faster")}
