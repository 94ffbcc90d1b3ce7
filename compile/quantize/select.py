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

Ranking a candidate of decoder layer b leaves layers 0..b-1 as they were, so their outputs are the reference
pass's: while it is measured, those layers are stood in for by `Replay`s that return the outputs recorded then
(the same tensors, so the drift is the same to the bit), and each ranking pass computes only layers b onwards,
about half a pass on average. The recording is kept only while it fits REPLAY_BYTES.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from compile.fp8 import candidate_layer, candidate_linears, swap

REPLAY_BYTES = 2 << 30
"""The most memory the decoder layers' recorded outputs may take (calibration batches x layers x tokens x hidden):
beyond it, every ranking pass computes every layer."""

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


class Replay(nn.Module):
    """Stands in for a decoder layer that a measurement leaves as it was: returns the layer's outputs of the
    reference pass, one per call, in the order the calibration batches are scored (see the module docstring)."""

    def __init__(self, outputs: list[torch.Tensor]):
        super().__init__()
        self.outputs, self.calls = outputs, 0

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        if self.calls == len(self.outputs):
            raise RuntimeError(f"replayed layer called {self.calls + 1} times, more than the {len(self.outputs)} "
                               f"calls recorded")
        out = self.outputs[self.calls]
        if out.shape != x.shape:
            raise RuntimeError(f"replayed layer output {tuple(out.shape)} for an input {tuple(x.shape)}: the "
                               f"calibration batches were not scored in the recorded order")
        self.calls += 1
        return out


def record_layer_outputs(model: nn.Module, run: Run) -> tuple[list, list[list[torch.Tensor]] | None]:
    """run() with every decoder layer but the last recording its outputs: (what run returned, per layer its
    outputs in call order), or None for the outputs where they pass REPLAY_BYTES (then nothing is kept)."""
    outputs: list[list[torch.Tensor]] = [[] for _ in model.layers[:-1]]
    recorded = 0

    def keep(index):
        def hook(module, args, out):
            nonlocal recorded
            if isinstance(out, torch.Tensor) and recorded + out.nbytes <= REPLAY_BYTES:
                outputs[index].append(out)
                recorded += out.nbytes
            else:
                recorded = REPLAY_BYTES + 1  # too large, or not a plain output: no replay
        return hook

    handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(model.layers[:-1])]
    try:
        result = run()
    finally:
        for handle in handles:
            handle.remove()
    return result, (outputs if recorded <= REPLAY_BYTES else None)


def select(model: nn.Module, run: Run, quantize: Quantizer, budget: float, replay: bool = True) -> Selection:
    """Rank the candidates of `model` (its `layers`) and choose under `budget` (max label log-prob change, nats).
    `run()` scores the calibration batches with the model as it currently is. replay: rank with the unchanged
    layers' recorded outputs (the same figures, fewer layers computed; see the module docstring)."""
    candidates = candidate_linears(model)
    reference, outputs = record_layer_outputs(model, run) if replay else (run(), None)
    quantized = {name: quantize(module) for name, module in candidates.items()}

    def measure(names: list[str]) -> tuple[float, float]:
        previous = swap(model, {n: quantized[n] for n in names})
        below = min(candidate_layer(n) for n in names) if outputs is not None else 0
        layers = list(model.layers[:below])
        for i in range(below):
            model.layers[i] = Replay(outputs[i])
        try:
            return drift(reference, run())
        finally:
            for i, layer in enumerate(layers):
                model.layers[i] = layer
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
