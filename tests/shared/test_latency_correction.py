"""The workers' latency models, corrected online from what answered batches really took."""

import pytest

from shared.latency_correction import CorrectedModel
from shared.latency_model import LatencyModel


def test_predictions_follow_observed_compute_and_overhead():
    model = CorrectedModel(LatencyModel(0.0, 0.01, 0.1, 1.0), max_items_per_batch=16, max_tokens_per_batch=4096)
    assert model.predict_ms(4, 100) == pytest.approx(1.0 + 1.0 + 0.4)
    for _ in range(50):  # the machine got twice as slow, and each batch costs 0.5 ms around the compute
        model.observe(4, 100, compute_ms=4.8, service_ms=5.3)
    assert model.predict_ms(4, 100) == pytest.approx(4.8 + 0.5, rel=0.01)


def test_backlog_is_served_in_full_batches():
    model = CorrectedModel(LatencyModel(0.0, 0.0, 0.0, 2.0), max_items_per_batch=16, max_tokens_per_batch=4096)
    assert model.backlog_ms(0, 0) == 0.0
    assert model.backlog_ms(16, 160) == pytest.approx(2.0)  # one batch
    assert model.backlog_ms(40, 400) == pytest.approx(6.0)  # three batches by samples
    assert model.backlog_ms(8, 8192) == pytest.approx(4.0)  # two batches by tokens


def test_outliers_are_clamped():
    model = CorrectedModel(LatencyModel(0.0, 0.0, 0.0, 1.0), max_items_per_batch=16, max_tokens_per_batch=4096)
    model.observe(1, 1, compute_ms=1e9, service_ms=1e9)
    assert model.predict_ms(1, 1) < 1 + 0.2 * 8 + 0.2 * 50 + 1e-9


def test_a_far_off_start_up_profile_is_replaced_by_a_fit_of_the_measurements():
    model = CorrectedModel(LatencyModel(270.0, 0.0, 0.0, 0.0), max_items_per_batch=16, max_tokens_per_batch=4096)
    assert not model.verified
    for b in (1, 2, 4, 8) * 16:  # the worker really takes 0.5 ms + 0.1 ms per sample
        model.observe(b, 10, compute_ms=0.5 + 0.1 * b, service_ms=0.6 + 0.1 * b)
    assert model.verified
    assert model.predict_ms(8, 10) == pytest.approx(0.5 + 0.8 + 0.1, abs=0.05)


def test_a_profile_within_the_jitter_is_not_replaced_by_a_fit_of_three_batches():
    """Three batches of 8 samples of 128 tokens, each 8-13 % faster than the true profile (12 ms a
    batch, little per token; what the simulator's sparse bursts met in a fast spell): a fit of just
    these (one shape) puts the time in proportion to the tokens with no fixed cost, and a short
    request would be predicted at a quarter of its time. The profile stays, corrected by the ratio."""
    true = LatencyModel(0.0015, 0.004, 0.0, 12.0)
    model = CorrectedModel(true, max_items_per_batch=16, max_tokens_per_batch=2048)
    for factor in (0.92, 0.92, 0.87):
        ms = true.predict_ms(8, 128) * factor
        model.observe(8, 128, compute_ms=ms, service_ms=ms)
    assert model.verified
    for b, tokens in ((8, 30), (8, 128), (16, 60)):
        assert model.predict_ms(b, tokens) == pytest.approx(true.predict_ms(b, tokens), rel=0.15)
