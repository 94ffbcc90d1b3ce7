"""Selective FP8: which linear layers run in float8 (e4m3), chosen offline by measured accuracy loss.

Offline, on a calibration set of scoring batches:
  1. calibrate: every candidate linear layer's input absmax (forward hooks) -> a static per-tensor
     activation scale; the weight's absmax -> a per-tensor weight scale (scale = absmax / 448);
  2. rank: each candidate alone in FP8, the change of the label probabilities against the model's
     own dtype (bf16 on a GPU) is measured on the whole set: max and mean |p_fp8 - p_ref|;
  3. choose: candidates in rank order are added while the measured change of the whole chosen set
     stays within the budget (max change, and at most `max_layers` layers).

`Fp8Linear` holds the float8 weight and both scales and calls `torch._scaled_mm` (tensor-wise
scales, the activation quantised with its offline scale). torch 2.13 runs `_scaled_mm` for
float8_e4m3fn on the CPU as well, so the selection runs the real operator there; where it is
missing (`scaled_mm_available()` is False) the layer *simulates* FP8 by quantise-dequantise
(round to e4m3 with the same scales, then an ordinary matmul in float32), and the report says so.
Candidates exclude the last layer's q/k/v projection (the scoring pass slices its weight for the
last-token queries, see Layer.forward_last) and the vocabulary projection (logit precision).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from worker.runtime.score_inputs import pack_inputs

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


@functools.cache
def scaled_mm_available(device: str = "cpu") -> bool:
    """Does torch._scaled_mm run float8_e4m3fn on this device (with this torch build and GPU)?"""
    try:
        a = torch.ones(16, 32, device=device).to(FP8)
        b = torch.ones(16, 32, device=device).to(FP8)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def quantise(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale saturated to the e4m3 range and rounded to float8_e4m3fn (same shape)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


class Fp8Linear(nn.Module):
    """y = x W^T + b with W and x in float8 e4m3, per-tensor scales fixed offline.

    The scales are Python floats, compiled into the package as literals: as tensor buffers,
    AOTInductor turned them into unnamed constants that a weights file cannot supply.
    """

    def __init__(self, linear: nn.Linear, input_absmax: float, simulate: bool):
        super().__init__()
        weight = linear.weight.detach()
        self.weight_scale = max(float(weight.abs().amax()), 1e-12) / FP8_MAX
        self.input_scale = max(float(input_absmax), 1e-12) / FP8_MAX
        self.register_buffer("weight_fp8", quantise(weight, self.weight_scale))  # [out, in] e4m3
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.simulate = simulate
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [..., in]
        x2 = quantise(x.reshape(-1, shape[-1]), self.input_scale)  # [M, in] e4m3
        if self.simulate:  # quantise-dequantise: FP8 rounding, float32 arithmetic
            y = F.linear(x2.float(), self.weight_fp8.float())
        else:
            one = torch.ones((), dtype=torch.float32, device=x.device)
            y = torch._scaled_mm(x2, self.weight_fp8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)  # [M, out]
        y = y * (self.input_scale * self.weight_scale)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


@dataclass(frozen=True)
class Fp8Budget:
    """How much accuracy the FP8 layers may cost, measured on the calibration set."""

    max_prob_change: float = 0.01
    """Largest allowed |p_fp8 - p_ref| of any label probability on the calibration set."""
    max_layers: int | None = None
    """At most this many FP8 layers (None: no limit)."""


@dataclass
class LayerLoss:
    """One candidate in FP8 on its own: its scales and the change it causes."""

    name: str
    input_absmax: float
    weight_absmax: float
    max_change: float
    mean_change: float


@dataclass
class Fp8Plan:
    """The chosen layers, their scales and the measured accuracy effect (JSON-ready via to_dict)."""

    chosen: list[str]
    input_absmax: dict[str, float]
    ranked: list[LayerLoss]
    max_change: float
    mean_change: float
    mode: str
    budget: dict = field(default_factory=dict)
    calibration_batches: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def candidate_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Linear layers of the decoder that may run in FP8 (see the module docstring for exclusions), named
    "layers.{i}.{path in the layer}" (`candidate_layer` reads i back)."""
    last = len(model.layers) - 1
    return {
        f"layers.{i}.{name}": module
        for i, layer in enumerate(model.layers)
        for name, module in layer.named_modules()
        if isinstance(module, nn.Linear) and not (i == last and name == "attn.qkv")
    }


def candidate_layer(name: str) -> int:
    """The decoder layer index of a `candidate_linears` name."""
    return int(name.split(".")[1])


def calibrate(score_module: nn.Module, batches: list[tuple], names: dict[str, nn.Linear]) -> dict[str, float]:
    """Input absmax of every named linear over the calibration batches."""
    absmax = dict.fromkeys(names, 0.0)

    def hook(name):
        return lambda module, args: absmax.__setitem__(name, max(absmax[name], float(args[0].abs().amax())))

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in names.items()]
    try:
        label_probs(score_module, batches)
    finally:
        for handle in handles:
            handle.remove()
    return absmax


def label_probs(score_module: nn.Module, batches: list[tuple]) -> list[torch.Tensor]:
    """Softmax over the labels [B, N] of every batch (output 2 of the scoring node), float32."""
    with torch.inference_mode():
        return [score_module(*batch)[2].float() for batch in batches]


def change(reference: list[torch.Tensor], probs: list[torch.Tensor], label_masks: list[torch.Tensor]) -> tuple[float, float]:
    """(max, mean) |p - p_ref| over every real label slot of every sample."""
    diffs = torch.cat([(p - r)[:, m].abs().flatten() for r, p, m in zip(reference, probs, label_masks)])
    return float(diffs.max()), float(diffs.mean())


def swap(model: nn.Module, names: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Put each named module in place; returns what was there before."""
    previous = {}
    for name, module in names.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        previous[name] = getattr(parent, child)
        setattr(parent, child, module)
    return previous


def select_fp8(score_module: nn.Module, batches: list[tuple], budget: Fp8Budget = Fp8Budget(),
               simulate: bool | None = None, ranked: list[LayerLoss] | None = None) -> Fp8Plan:
    """Rank every candidate by its measured label-probability change, choose under the budget.

    `batches` are the scoring node's inputs (compile/score/module.py: pack_inputs), label_mask last.
    `ranked` (a previous plan's ranking on the same batches) skips the ranking pass.
    The model is left unchanged; `apply_fp8(model, plan)` makes the swap.
    """
    model = score_module.model
    device = next(model.parameters()).device
    simulate = not scaled_mm_available(device.type) if simulate is None else simulate
    masks = [batch[-1] for batch in batches]  # label_mask, the last input
    names = candidate_linears(model)
    absmax = calibrate(score_module, batches, names)
    reference = label_probs(score_module, batches)

    def measure(chosen: list[str]) -> tuple[float, float]:
        originals = swap(model, {n: Fp8Linear(names[n], absmax[n], simulate) for n in chosen})
        try:
            return change(reference, label_probs(score_module, batches), masks)
        finally:
            swap(model, originals)

    if ranked is None:
        ranked = []
        for name in names:
            worst, mean = measure([name])
            ranked.append(LayerLoss(name, absmax[name], float(names[name].weight.abs().amax()), worst, mean))
        ranked.sort(key=lambda loss: (loss.max_change, loss.mean_change))
    chosen, totals = [], (0.0, 0.0)
    for loss in ranked:
        if budget.max_layers is not None and len(chosen) >= budget.max_layers:
            break
        if loss.max_change > budget.max_prob_change:
            break  # ranked: every later layer alone already exceeds the budget
        trial = measure(chosen + [loss.name])
        if trial[0] <= budget.max_prob_change:
            chosen, totals = chosen + [loss.name], trial
    mode = "simulated FP8 (quantise-dequantise, float32 matmul)" if simulate else f"torch._scaled_mm on {device.type}"
    return Fp8Plan(chosen, {n: absmax[n] for n in chosen}, ranked, totals[0], totals[1], mode,
                   asdict(budget), len(batches))


def apply_fp8(model: nn.Module, plan: Fp8Plan, simulate: bool = False) -> nn.Module:
    """Replace the plan's layers of `model` by Fp8Linear (in place); returns the model."""
    names = candidate_linears(model)
    unknown = sorted(set(plan.chosen) - set(names))
    if unknown:
        raise ValueError(f"FP8 plan names layers this model does not have or cannot run in FP8: {unknown}")
    swap(model, {n: Fp8Linear(names[n], plan.input_absmax[n], simulate) for n in plan.chosen})
    return model


def pack_batch(samples: list[torch.Tensor], label_ids: list[int], max_labels: int, device: str = "cpu") -> tuple:
    """Scoring-node inputs for a list of 1-D token tensors and label ids (as the runtime packs them)."""
    lens = torch.tensor([len(s) for s in samples])
    batch = pack_inputs(torch.cat(samples), lens, torch.tensor(label_ids, dtype=torch.int64), max_labels)
    return tuple(t.to(device) for t in batch)


def random_calibration(vocab_size: int, num_batches: int, samples: int, lengths: tuple[int, int],
                       label_ids: list[int], max_labels: int, device: str = "cpu", seed: int = 0) -> list[tuple]:
    """Batches of random token ids: a stand-in calibration set for random-weight benchmark models.

    A real deployment calibrates on its own traffic (texts tokenized as the gateway does).
    """
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        lens = torch.randint(lengths[0], lengths[1] + 1, (samples,), generator=generator).tolist()
        tokens = [torch.randint(0, vocab_size, (n,), generator=generator) for n in lens]
        batches.append(pack_batch(tokens, label_ids, max_labels, device))
    return batches


def fp8_for_build(config, model: nn.Module, stage=lambda message: None) -> dict | None:
    """The build's `[model] fp8` step: choose layers and swap them into `model` in place.

    Calibrates on random token ids (a stand-in until a deployment supplies its own texts) with
    label ids spread over the vocabulary. Refuses a device without torch._scaled_mm rather than
    compiling the simulation into the packages. Returns the manifest's "fp8" facts (None when off).
    """
    if not config.model.fp8:
        return None
    from compile.score.module import ScoreModule

    device = next(model.parameters()).device
    if not scaled_mm_available(device.type):
        raise ValueError(f"model.fp8 = true needs torch._scaled_mm for float8_e4m3fn on {device}, which this "
                         "torch build or GPU lacks (CUDA needs compute capability 8.9+); set model.fp8 = false")
    if device.type == "cpu":
        stage("warning: model.fp8 on a CPU: torch runs _scaled_mm there as a check of the FP8 package's numbers, "
              "not fast (the demo model's scoring call took 86x float32's, on an AMX Xeon); quantize.int8 is "
              "the CPU's quantization")
    b, vocab = config.build_bounds, model.spec.vocab_size
    labels = [vocab // 4, vocab // 2, 3 * vocab // 4][: b.max_labels]
    batches = random_calibration(vocab, 4, min(8, b.max_samples_per_batch), (4, min(128, b.max_tokens_per_sample)),
                                 labels, b.max_labels, str(device))
    stage(f"selecting FP8 layers (budget: label probabilities change <= {config.model.fp8_max_prob_change})")
    plan = select_fp8(ScoreModule(model, 1).eval(), batches, Fp8Budget(config.model.fp8_max_prob_change))
    apply_fp8(model, plan)
    stage(f"FP8: {len(plan.chosen)} of {len(plan.ranked)} linear layers, max label-probability change "
          f"{plan.max_change:.4g}, mean {plan.mean_change:.3g} ({plan.mode})")
    return {"layers": plan.chosen, "input_absmax": plan.input_absmax, "candidates": len(plan.ranked), "max_label_prob_change": plan.max_change,
            "mean_label_prob_change": plan.mean_change, "mode": plan.mode, "budget": plan.budget,
            "calibration": f"{len(batches)} batches of random token ids"}
