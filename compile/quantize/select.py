"""Which linear layers run int8: chosen offline by their measured effect on the label log-probabilities of a
calibration set.

  1. rank: every candidate alone quantized; the largest change of any label log-probability over the calibration
     batches (nats) is its drift. Candidates are ordered by drift per weight element moved to int8, so that the
     prefix bought for a given drift carries the most FLOPs (ordered by drift alone, the cheap output projections
     come first and the MLP, ~88 % of a layer's GEMM FLOPs, last);
  2. choose: the longest prefix of that order whose layers, quantized together, keep the drift within the budget
     (binary search; every probe is a real measurement and the chosen set is the last probe that passed).
Candidates are the decoder layers' projections (compile/fp8.candidate_linears: never the embedding, the final
norm or the output projection, which stay in the model's precision, nor the last layer's fused q/k/v, which the
scoring pass slices). The model is left as it was; the caller swaps the chosen layers in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from compile.fp8 import candidate_linears, swap

Quantizer = Callable[[nn.Module], nn.Module]  # a float linear -> its quantized replacement
Run = Callable[[], list[tuple[torch.Tensor, torch.Tensor]]]  # calibration batches -> (label log-probs, top-1)


@dataclass
class LayerDrift:
    """One candidate quantized on its own: the label log-prob change it causes (nats) and its weight size."""

    name: str
    max_drift: float
    mean_drift: float
    weights: int


@dataclass
class Selection:
    """The chosen layers, the measured drift of the chosen set on the calibration batches, and how it was found."""

    chosen: list[str]
    ranked: list[LayerDrift]
    max_drift: float
    mean_drift: float
    budget: float
    probes: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def drift(reference: list[tuple[torch.Tensor, torch.Tensor]], got: list[tuple[torch.Tensor, torch.Tensor]]
          ) -> tuple[float, float]:
    """(max, mean) |change of label log-prob| over every sample and real label of every batch."""
    diffs = torch.cat([(g[0].float() - r[0].float()).abs().flatten() for r, g in zip(reference, got)])
    return float(diffs.max()), float(diffs.mean())


def select(model: nn.Module, run: Run, quantize: Quantizer, budget: float) -> Selection:
    """Rank the candidates of `model` (its `layers`) and choose under `budget` (max label log-prob change, nats).
    `run()` scores the calibration batches with the model as it currently is."""
    candidates = candidate_linears(model)
    reference = run()
    quantized = {name: quantize(module) for name, module in candidates.items()}

    def measure(names: list[str]) -> tuple[float, float]:
        previous = swap(model, {n: quantized[n] for n in names})
        try:
            return drift(reference, run())
        finally:
            swap(model, previous)

    ranked = [LayerDrift(n, *measure([n]), candidates[n].weight.numel()) for n in candidates]
    ranked.sort(key=lambda d: (d.max_drift / d.weights, d.mean_drift))
    order = [d.name for d in ranked if d.max_drift <= budget]  # one that breaks the budget alone never fits
    best, best_figures, probes = 0, (0.0, 0.0), []
    low, high = 1, len(order)
    while low <= high:
        k = (low + high) // 2
        figures = measure(order[:k])
        probes.append({"layers": k, "max_drift": figures[0], "mean_drift": figures[1]})
        if figures[0] <= budget:
            best, best_figures, low = k, figures, k + 1
        else:
            high = k - 1
    return Selection(order[:best], ranked, best_figures[0], best_figures[1], budget, probes)
