"""bench/prefix_cache.py: interleaved rounds with their spread, no speedup above the FLOP bound or inside the
noise claimed, and no result written past its parity bound."""

import json

import numpy as np
import pytest

from bench.harness import provenance, rounds
from bench.prefix_cache import PARITY_ABS, _lcp, summary, turns, workloads
from compile.checkpoint import read_spec


def test_a_speedup_whose_rounds_straddle_one_is_within_noise_and_claims_nothing():
    found = rounds.speedup([0.97, 1.05, 1.01], bound=1.4)
    assert found["verdict"] == "within noise" and found["claimed"] is None
    assert (found["min"], found["median"], found["max"]) == (0.97, 1.01, 1.05)


def test_a_speedup_above_its_flop_bound_is_claimed_only_up_to_the_bound():
    found = rounds.speedup([1.3935, 1.40, 1.38], bound=1.389)  # the committed run's 1.3935x over its 1.389 bound
    assert found["verdict"] == "faster" and found["claimed"] == 1.389 and "above the FLOP bound" in found["note"]
    below = rounds.speedup([1.2, 1.25, 1.3], bound=1.389)
    assert below["claimed"] == 1.25 and below["note"] is None


def test_a_zero_reuse_change_inside_the_spread_is_within_noise_not_met():
    assert rounds.change([-0.053, 0.01, -0.02])["verdict"] == "within noise"
    assert rounds.change([0.03, 0.05])["verdict"] == "slower"
    assert rounds.change([-0.03, -0.05])["verdict"] == "faster"
    with pytest.raises(ValueError, match="no rounds"):
        rounds.spread([])


def test_the_rounds_take_turns_on_fresh_work():
    assert turns(["on", "off"], 3) == [["on", "off"], ["off", "on"], ["on", "off"]]
    work = [workloads(seed, 4096, 1, 1, 1, 1) for seed in range(2)]
    assert work[0]["session"] != work[1]["session"]  # a new seed per round: nothing cached from the last one


def answers(sessions, cached: bool, shift: float) -> list[list[dict]]:
    """Per session and page, the gateway's answer: label logits and the cached tokens it counted (a page after
    the first reads its context from the cache when `cached`)."""
    out = []
    for k, pages in enumerate(sessions):
        out.append([{"scores": (np.full((len(samples), 2), float(k)) + shift).tolist(),
                     "usage": {"prompt_tokens_details": {"cached_tokens": len(samples) * _lcp(samples)
                                                         if cached and page else 0}}}
                    for page, samples in enumerate(pages)])
    return out


def measured(work: list[dict], shift: float, on_s: list[float], off_s: list[float]) -> list[dict]:
    return [{"on": {"session": {"seconds": a, "answers": answers(w["session"], True, shift), "cache": {"hits": 1, "misses": 1}},
                    "unique": {"seconds": a}},
             "off": {"session": {"seconds": b, "answers": answers(w["session"], False, 0.0)}, "unique": {"seconds": b}}}
            for w, a, b in zip(work, on_s, off_s)]


@pytest.mark.parametrize("shift, written", [(PARITY_ABS / 2, True), (PARITY_ABS * 5, False)])
def test_a_result_past_its_parity_bound_is_refused_and_nothing_is_written(demo_checkpoint, tmp_path, monkeypatch,
                                                                          shift, written):
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    spec = read_spec(demo_checkpoint)
    work = [workloads(seed, spec.vocab_size, 2, 1, 1, 1) for seed in range(2)]
    result = summary(spec, work, measured(work, shift, [1.0, 1.1], [1.3, 1.2]), session_requests=8)
    assert result["max_abs_diff_vs_uncached"] == pytest.approx(shift)
    assert result["speedup_vs_cache_off"]["rounds"] == pytest.approx([1.3, 1.2 / 1.1])
    assert result["zero_reuse_slowdown"]["verdict"] == "faster"
    if written:
        provenance.write_result("prefix_cache-test", result, quick=True, threads=1)
        assert json.loads((tmp_path / "prefix_cache-test.json").read_text())["parity"][0]["ok"] is True
    else:
        with pytest.raises(provenance.ParityFailed, match="session label logits, cache on vs off"):
            provenance.write_result("prefix_cache-test", result, quick=True, threads=1)
        assert not (tmp_path / "prefix_cache-test.json").exists()
