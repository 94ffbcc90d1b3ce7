"""A worker's fitted latency model, corrected online from the compute times it reports.

The worker fits T = (alpha*B + beta)*L + gamma*B + delta at start-up (shared/latency_model.py);
machines drift (other load, thermal state), so every answered batch updates a smoothed ratio of
observed to predicted compute time, and a smoothed per-batch overhead (what the gateway waits for
beyond the compute: messages, copies, the worker's wake-up), and predictions use both. Every
REFIT_EVERY batches the model is also refitted on the recent measurements, so a start-up profile
that is far off (a profile taken on a busy machine) cannot stay wrong.

Pure (no clock, no I/O): the gateway (gateway/worker_link.py) feeds it the workers' answers and the
simulator (loadgen/simulator.py) its simulated batches, so both predict alike.
"""

from __future__ import annotations

import math
from collections import deque

from shared.latency_model import LatencyModel

SMOOTHING = 0.2
MIN_RATIO, MAX_RATIO = 0.25, 8.0
MAX_OVERHEAD_MS = 50.0
WINDOW, REFIT_EVERY, VERIFIED_AFTER = 128, 64, 3
FAR_OFF_SHARE = 0.5
"""A profile whose error (rmse) over the measured batches exceeds this share of their mean time is
far off: replaced by a fit of the first few measurements (otherwise only once REFIT_EVERY are in)."""


class CorrectedModel:
    """predict_ms = fitted prediction x online correction ratio."""

    def __init__(self, model: LatencyModel, max_items_per_batch: int, max_tokens_per_batch: int | None,
                 ratio: float = 1.0) -> None:
        self.model = model
        self.ratio = ratio
        self.overhead_ms = 0.0
        self.max_items_per_batch = max(1, max_items_per_batch)
        self.max_tokens_per_batch = None if max_tokens_per_batch is None else max(1, max_tokens_per_batch)
        """None: batches have no token bound (beam search)."""
        self.observations = 0
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)

    @property
    def verified(self) -> bool:
        """Whether measured batches have confirmed (or corrected) the start-up profile."""
        return self.observations >= VERIFIED_AFTER

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float:
        """Compute time x ratio, plus the per-batch cost around it (messages, copies, wake-ups)."""
        return max(0.0, self.model.predict_ms(batch_items, tokens_per_item)) * self.ratio + self.overhead_ms

    def observe(self, batch_items: float, tokens_per_item: float, compute_ms: float, service_ms: float) -> None:
        """Fold one answered batch in: `compute_ms` as the worker measured it, `service_ms` as the
        gateway saw it (send to answer, less the time the batch waited behind another in the worker)."""
        if not (math.isfinite(compute_ms) and math.isfinite(service_ms)):
            return
        predicted = self.model.predict_ms(batch_items, tokens_per_item)
        if predicted > 0.01 and compute_ms > 0:
            ratio = min(MAX_RATIO, max(MIN_RATIO, compute_ms / predicted))
            self.ratio += SMOOTHING * (ratio - self.ratio)
        overhead = min(MAX_OVERHEAD_MS, max(0.0, service_ms - compute_ms))
        self.overhead_ms += SMOOTHING * (overhead - self.overhead_ms)
        self.observations += 1
        self._recent.append((batch_items, tokens_per_item, compute_ms))
        if self.observations % REFIT_EVERY == 0 or self.observations == VERIFIED_AFTER:
            self._refit()

    def _refit(self) -> None:
        try:
            fitted = LatencyModel.fit(self._recent)
        except ValueError:
            return
        samples = list(self._recent)
        new, old = fitted.rmse_ms(samples), CorrectedModel(self.model, 1, 1, self.ratio).rmse_ms(samples)
        # few distinct batch sizes fit a model that may extrapolate badly: then only a far better fit wins
        spread = len({b for b, _, _ in samples}) >= 3
        # the early refit, on VERIFIED_AFTER samples, is for a far-off start-up profile: four
        # coefficients fit three jittered batches of one size almost exactly (in-sample), e.g. as
        # time proportional to tokens with no fixed cost, which puts a short request at a fraction
        # of its time; a profile within the jitter is left to the ratio until REFIT_EVERY samples
        early = len(samples) < REFIT_EVERY
        far_off = old > FAR_OFF_SHARE * sum(t for _, _, t in samples) / len(samples)
        if new < old and (spread or new < 0.5 * old) and (far_off or not early):
            self.model, self.ratio = fitted, 1.0

    def rmse_ms(self, samples: list[tuple[float, float, float]]) -> float:
        return math.sqrt(sum((self.model.predict_ms(b, l) * self.ratio - t) ** 2 for b, l, t in samples)
                         / max(1, len(samples)))

    def backlog_ms(self, items: int, tokens: int) -> float:
        """Predicted time to serve `items` items of `tokens` tokens in total, in full batches."""
        if items <= 0:
            return 0.0
        by_tokens = math.ceil(tokens / self.max_tokens_per_batch) if self.max_tokens_per_batch else 1
        batches = max(math.ceil(items / self.max_items_per_batch), by_tokens, 1)
        return batches * self.predict_ms(items / batches, tokens / items)

