"""The latency model: fit recovers known coefficients, stays non-negative, round-trips as a dict."""

import itertools
import random

import pytest

from shared.latency_model import LatencyModel


def grid(model, noise=0.0, seed=0):
    rng = random.Random(seed)
    return [
        (b, l, model.predict_ms(b, l) * (1 + rng.uniform(-noise, noise)))
        for b, l in itertools.product([1, 2, 4, 8, 16], [16, 64, 128, 300, 512])
    ]


def test_fit_recovers_exact_coefficients():
    truth = LatencyModel(alpha=0.1, beta=5.7, gamma=0.01, delta=43.67)
    fitted = LatencyModel.fit(grid(truth))
    for name in ("alpha", "beta", "gamma", "delta"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-9)


def test_fit_with_noise_predicts_close():
    truth = LatencyModel(alpha=0.0002, beta=0.275, gamma=0.00088, delta=15.85)
    samples = grid(truth, noise=0.02, seed=3)
    fitted = LatencyModel.fit(samples)
    assert fitted.rmse_ms(samples) < 0.05 * max(t for _, _, t in samples)


def test_fit_never_returns_negative_coefficients():
    # Latency that falls with batch size cannot be expressed with gamma >= 0; the fit must clamp.
    samples = [(b, 100, 50.0 - b) for b in (1, 2, 4, 8)]
    fitted = LatencyModel.fit(samples)
    assert min(fitted.alpha, fitted.beta, fitted.gamma, fitted.delta) >= 0
    assert fitted.predict_ms(1, 100) > 0


def test_fit_single_sample_and_errors():
    fitted = LatencyModel.fit([(4, 100, 10.0)])
    assert fitted.predict_ms(4, 100) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="at least one"):
        LatencyModel.fit([])
    with pytest.raises(ValueError, match="finite"):
        LatencyModel.fit([(1, 1, float("nan"))])


def test_dict_round_trip_and_bad_dicts():
    model = LatencyModel(0.1, 5.7, 0.01, 43.67)
    assert LatencyModel.from_dict(model.to_dict()) == model
    with pytest.raises(ValueError, match="missing"):
        LatencyModel.from_dict({"alpha": 1.0})
    with pytest.raises(ValueError, match="unexpected"):
        LatencyModel.from_dict({**model.to_dict(), "zeta": 1.0})
    with pytest.raises(ValueError, match="finite"):
        LatencyModel.from_dict({**model.to_dict(), "beta": "x"})


def test_max_batch_size_inverts_predict():
    model = LatencyModel(0.01, 0.1, 0.5, 2.0)
    b = model.max_batch_size(tokens=100, budget_ms=50.0, limit=64)
    assert model.predict_ms(b, 100) <= 50.0 < model.predict_ms(b + 1, 100)
    assert model.max_batch_size(tokens=100, budget_ms=1.0, limit=64) == 0
    assert LatencyModel(0, 0, 0, 1.0).max_batch_size(10, 5.0, limit=7) == 7


def test_predict_batch_ms_uses_computed_tokens_per_sample():
    model = LatencyModel(0.01, 0.1, 0.5, 2.0)
    assert model.predict_batch_ms(15, 600) == pytest.approx(model.predict_ms(15, 40))
    assert model.predict_batch_ms(0, 0) == pytest.approx(model.predict_ms(0, 0))
