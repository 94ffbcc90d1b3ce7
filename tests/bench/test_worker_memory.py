"""bench/worker_memory.py: the two sides' beams must agree for a result to be written."""

from __future__ import annotations

from bench.worker_memory import BEAMS_ABS, parity, parse_args


def side(scores, tokens):
    return {"scores": scores, "tokens": tokens}


def test_the_same_beams_pass_and_any_difference_fails():
    kept = side([[-1.0, -2.0], [-0.5]], [[3, 4], [5]])
    assert parity(kept, side([[-1.0, -2.0], [-0.5]], [[3, 4], [5]]))[0]["ok"] is True
    assert parity(kept, side([[-1.0, -2.0 + 10 * BEAMS_ABS], [-0.5]], [[3, 4], [5]]))[0]["ok"] is False
    assert parity(kept, side([[-1.0, -2.0], [-0.5]], [[3, 4], [6]]))[0]["ok"] is False
    assert parity(kept, side([[-1.0, -2.0]], [[3, 4]]))[0]["ok"] is False  # a side that stopped short


def test_quick_is_two_layers_and_a_limit_its_releases_pass():
    quick = parse_args(["--quick"])
    assert (quick.layers, quick.calls, quick.limit_mb) == (2, 20, 256)
    full = parse_args([])
    assert (full.calls, full.limit_mb) == (150, 3072) and full.layers > 2
