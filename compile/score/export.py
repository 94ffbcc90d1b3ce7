"""Export of the scoring node for a deployment's bounds, and its node builder for `python -m compile`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.export import Dim

from compile.score.heads import MlpHead
from compile.score.module import OUTPUT_NAMES, ScoreModule
from shared.config import BoundsConfig, MlpHeadConfig

if TYPE_CHECKING:
    from compile.build import BuildContext


def build(ctx: BuildContext) -> tuple[torch.nn.Module, torch.export.ExportedProgram, dict]:
    """Node builder: the scoring node of ctx's model under ctx.config's bounds (+ the MLP head)."""
    head = load_mlp_head(ctx.config.score.mlp_head, ctx.checkpoint.spec.hidden_size)
    module = ScoreModule(ctx.model, ctx.config.bounds.max_top_k, head).to(ctx.device)
    outputs = OUTPUT_NAMES + (("head",) if head is not None else ())
    return module, export_score_node(module, ctx.config.bounds, ctx.device), {"outputs": list(outputs)}


def example_inputs(bounds: BoundsConfig, vocab_size: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """A small valid batch (two samples) used to trace the node."""
    lens = [3, 5]
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    ids = torch.arange(sum(lens), dtype=torch.int64) % vocab_size
    positions = torch.cat([torch.arange(n) for n in lens])
    label_ids = torch.zeros(bounds.max_labels, dtype=torch.int64)
    label_mask = torch.zeros(bounds.max_labels, dtype=torch.bool)
    label_mask[:2] = True
    return tuple(t.to(device) for t in (ids, positions, cu, label_ids, label_mask))


def dynamic_shapes(bounds: BoundsConfig) -> tuple:
    """Token count and sample count are dynamic; one extra token allows a 1-sample batch's filler."""
    tokens = Dim("tokens", min=2, max=bounds.max_tokens_per_batch + 1)
    samples = Dim("samples", min=2, max=bounds.max_samples_per_batch)
    return ({0: tokens}, {0: tokens}, {0: samples + 1}, None, None)


def export_score_node(module: ScoreModule, bounds: BoundsConfig, device: str = "cpu") -> torch.export.ExportedProgram:
    args = example_inputs(bounds, module.model.spec.vocab_size, device)
    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes(bounds), strict=False)


def load_mlp_head(head: MlpHeadConfig | None, hidden_size: int) -> MlpHead | None:
    """The user's classification head, checked against its declared layer sizes."""
    if head is None:
        return None
    from safetensors.torch import load_file

    if head.layer_sizes[0] != hidden_size:
        raise ValueError(
            f"score.mlp_head.layer_sizes[0] = {head.layer_sizes[0]} must equal the model's hidden size {hidden_size}"
        )
    module = MlpHead(head.layer_sizes, head.activation)
    tensors = load_file(head.weights)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != got:
        raise ValueError(
            f"score.mlp_head.weights {head.weights}: tensors {got} do not match layer_sizes "
            f"{list(head.layer_sizes)}, which need {expected}"
        )
    module.load_state_dict({k: v.float() for k, v in tensors.items()})
    return module.eval().requires_grad_(False)
