"""The batch latency model T = (alpha*B + beta)*L + gamma*B + delta, fitted by least squares.

From seed 002: per workload, a batch of B items of L tokens each takes `T` milliseconds, where
`alpha` is the per-token cost that grows with batch size, `beta` the per-token cost, `gamma` the
per-item cost and `delta` the fixed cost of one call. Pure Python/NumPy; no torch.

What B and L mean for each workload (the worker profiles with exactly these, the gateway must
predict with them too):
  - "score": B = samples in the batch, L = mean computed tokens per sample (computed tokens / B).
    Computed tokens (shared.prefix.computed_tokens) count a request's shared prefix once and never count the
    deployment's static prefix, whose keys/values were computed at build time; the profile is
    taken on unshared random batches, where computed tokens are all tokens.
  - "beam":  B = requests * num_beams (beams decoded together), L = mean prompt tokens per request.
    The decode steps are part of the per-workload constants (the profile is taken at the
    deployment's max_new_tokens, so predictions are conservative for fewer steps).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


WORKLOADS = ("score", "beam")
COEFFICIENTS = ("alpha", "beta", "gamma", "delta")


@dataclass(frozen=True)
class LatencyModel:
    """Coefficients of T_ms = (alpha*B + beta)*L + gamma*B + delta, all >= 0 when fitted."""

    alpha: float
    beta: float
    gamma: float
    delta: float

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"LatencyModel.{name} must be a finite number, got {value!r}")

    def predict_ms(self, batch_size: float, tokens: float) -> float:
        """Predicted milliseconds for `batch_size` items of `tokens` tokens each (mean)."""
        return (self.alpha * batch_size + self.beta) * tokens + self.gamma * batch_size + self.delta

    def predict_batch_ms(self, samples: int, computed: int) -> float:
        """Predicted milliseconds for a scoring batch of `samples` samples and `computed` computed
        tokens (see computed_tokens; shared prefixes once)."""
        return self.predict_ms(samples, computed / max(1, samples))

    def predict_sum_ms(self, batches: float, items: float, item_tokens: float, tokens: float) -> float:
        """Predicted milliseconds of `batches` batches, summed, from their sums alone: B (`items`), B*L
        (`item_tokens`) and L (`tokens`); predict_ms is linear in its coefficients."""
        return self.alpha * item_tokens + self.beta * tokens + self.gamma * items + self.delta * batches

    def max_batch_size(self, tokens: float, budget_ms: float, limit: int) -> int:
        """Largest B in [0, limit] whose predicted time at `tokens` per item fits `budget_ms`."""
        per_item = self.alpha * tokens + self.gamma
        fixed = self.beta * tokens + self.delta
        if fixed > budget_ms:
            return 0
        if per_item <= 0:
            return limit
        return max(0, min(limit, int((budget_ms - fixed) / per_item)))

    @classmethod
    def fit(cls, samples: Iterable[tuple[float, float, float]]) -> LatencyModel:
        """Least-squares fit over (batch_size, tokens, ms) samples, coefficients constrained >= 0.

        Non-negativity keeps predictions monotone in B and L, which admission control relies on.
        With four coefficients an exact active-set search (all 16 subsets of free coefficients) is
        cheap and needs no iterative solver.
        """
        data = np.asarray(list(samples), dtype=np.float64).reshape(-1, 3)  # [n, 3]
        if data.shape[0] == 0:
            raise ValueError("LatencyModel.fit needs at least one (batch_size, tokens, ms) sample")
        if not np.all(np.isfinite(data)):
            raise ValueError("LatencyModel.fit: samples must be finite numbers")
        b, l, t = data[:, 0], data[:, 1], data[:, 2]
        features = np.stack([b * l, l, b, np.ones_like(b)], axis=1)  # [n, 4]
        best, best_err = np.zeros(4), float(np.sum(t**2))
        for size in range(1, 5):
            for cols in itertools.combinations(range(4), size):
                coef, *_ = np.linalg.lstsq(features[:, cols], t, rcond=None)
                if np.any(coef < 0):
                    continue
                err = float(np.sum((features[:, cols] @ coef - t) ** 2))
                if err < best_err - 1e-12 * max(1.0, best_err):
                    best, best_err = np.zeros(4), err
                    best[list(cols)] = coef
        return cls(*(float(c) for c in best))

    def rmse_ms(self, samples: Iterable[tuple[float, float, float]]) -> float:
        """Root-mean-square prediction error over (batch_size, tokens, ms) samples."""
        errors = [self.predict_ms(b, l) - t for b, l, t in samples]
        return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else 0.0

    def to_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in COEFFICIENTS}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LatencyModel:
        """Inverse of to_dict; names the missing or extra key."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"latency model must be a map, got {type(raw).__name__}")
        missing = [k for k in COEFFICIENTS if k not in raw]
        extra = sorted(str(k) for k in raw if k not in COEFFICIENTS)
        if missing or extra:
            raise ValueError(f"latency model keys: missing {missing}, unexpected {extra}")
        return cls(*(raw[k] for k in COEFFICIENTS))
