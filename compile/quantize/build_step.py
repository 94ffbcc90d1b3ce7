"""The build's `[quantize] int8` step: calibration batches, the layer selection, the swap and the accuracy gate.

The calibration samples (the deployment's file of token ids, or random ids as a last resort) are cut into
scoring batches; even batches choose the layers (select.py), odd ones are held out for the gate (gate.py), which
compares the model with the chosen layers in int8 against the float model and refuses the build, before any
artifact is written, when a `[quantize]` limit is missed. The chosen layers are swapped into the model in place,
so every node compiled after this step (scoring, beam, the static prefix's keys/values) runs them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compile.fp8 import candidate_linears, pack_batch, random_calibration, swap
from compile.quantize.gate import GateLimits, QuantizationRefused, check, figures
from compile.quantize.int8 import Int8Linear, activation_max
from compile.quantize.select import select

BATCH_SAMPLES = 8
RANDOM_BATCHES = 4


def read_calibration(path: Path, max_tokens: int, vocab_size: int) -> list[torch.Tensor]:
    """One sample per non-empty line of space-separated token ids; refuses what the bounds cannot hold."""
    samples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids = [int(t) for t in line.split()]
        except ValueError:
            raise ValueError(f"quantize.calibration {path}, line {number}: expected token ids separated by "
                             f"spaces") from None
        if len(ids) > max_tokens:
            raise ValueError(f"quantize.calibration {path}, line {number}: {len(ids)} tokens, more than "
                             f"bounds.max_tokens_per_sample ({max_tokens})")
        if any(not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"quantize.calibration {path}, line {number}: a token id outside the vocabulary "
                             f"(0..{vocab_size - 1})")
        samples.append(torch.tensor(ids, dtype=torch.int64))
    return samples


def calibration_batches(config, vocab_size: int, labels: list[int], device: str) -> tuple[list[tuple], str]:
    """The scoring batches to calibrate and gate on, and where they came from (for the manifest)."""
    b, q = config.build_bounds, config.quantize
    per_batch = min(BATCH_SAMPLES, b.max_samples_per_batch)
    if not q.calibration:
        batches = random_calibration(vocab_size, RANDOM_BATCHES, per_batch, (4, min(128, b.max_tokens_per_sample)),
                                     labels, b.max_labels, device)
        return batches, f"{len(batches)} batches of {per_batch} random token-id samples (no quantize.calibration)"
    samples = read_calibration(Path(q.calibration), b.max_tokens_per_sample, vocab_size)
    cuts = [samples[i:i + per_batch] for i in range(0, len(samples), per_batch)]
    cuts = [c for c in cuts if sum(len(s) for s in c) <= b.max_tokens_per_batch] if cuts else []
    if len(cuts) < 2:
        raise ValueError(f"quantize.calibration {q.calibration}: {len(samples)} samples make {len(cuts)} batch(es) "
                         f"of {per_batch}; at least 2 are needed (one to choose the layers, one held out)")
    return [pack_batch(c, labels, b.max_labels, device) for c in cuts], \
        f"{len(samples)} samples from {q.calibration} in {len(cuts)} batches"


def scorer(score_module: nn.Module, batches: list[tuple]):
    """A function scoring `batches` with the module as it is: per batch (label log-probs [B, real labels],
    top-1 ids [B])."""
    def run() -> list[tuple[torch.Tensor, torch.Tensor]]:
        with torch.inference_mode():
            outs = [(score_module(*batch), batch[-1]) for batch in batches]
        return [(out[1][:, mask].float(), out[3][:, 0]) for out, mask in outs]
    return run


def int8_for_build(config, model: nn.Module, stage=lambda message: None) -> dict | None:
    """Choose the int8 layers, gate them on the held-out batches and swap them into `model` in place.
    Returns the manifest's "quantize" record (None when quantize.int8 is off); raises QuantizationRefused."""
    q = config.quantize
    if not q.int8:
        return None
    from compile.score.module import ScoreModule

    device, vocab = str(next(model.parameters()).device), model.spec.vocab_size
    labels = [vocab // 4, vocab // 2, 3 * vocab // 4][: config.build_bounds.max_labels]
    batches, source = calibration_batches(config, vocab, labels, device)
    notes = warnings(q)
    for note in notes:
        stage(f"warning: {note}")
    choose, held_out = batches[0::2], batches[1::2]
    score_module = ScoreModule(model, 1).eval()
    stage(f"int8: ranking {len(candidate_linears(model))} linear layers on {len(choose)} calibration batches "
          f"(budget: label log-probs change <= {q.selection_max_drift} nats)")
    selection = select(model, scorer(score_module, choose), Int8Linear, q.selection_max_drift)
    if not selection.chosen:
        raise QuantizationRefused(f"no linear layer fits the int8 selection budget (quantize.selection_max_drift = "
                                  f"{q.selection_max_drift:g} nats): the build would be labelled int8 and run float. "
                                  "Raise the budget, or set quantize.int8 = false")
    reference = scorer(score_module, held_out)()
    beams = beam_searcher(config, model, held_out) if config.beam.enabled else None
    beam_reference = beams() if beams else None
    candidates = candidate_linears(model)
    swap(model, {name: Int8Linear(candidates[name]) for name in selection.chosen})
    gate = figures(reference, scorer(score_module, held_out)())
    beam_changes = changed_candidates(beam_reference, beams()) if beams else None
    stage(f"int8: {len(selection.chosen)} of {len(candidates)} linear layers; held out: max label log-prob drift "
          f"{gate.max_label_logprob_drift:.4g}, mean {gate.mean_label_logprob_drift:.3g}, top-1 agreement "
          f"{gate.top1_agreement:.3f}, rank agreement {gate.rank_agreement:.3f}"
          + (f"; beam search: {beam_changes['changed']} of {beam_changes['candidates']} top-k candidates changed"
             if beam_changes else ""))
    check(gate, GateLimits(q.max_label_logprob_drift, q.mean_label_logprob_drift, q.min_top1_agreement,
                           q.min_rank_agreement))
    limits = {k: v for k, v in vars(q).items() if k not in ("int8", "calibration")}
    return {"int8_layers": selection.chosen, "float_layers": sorted(set(candidates) - set(selection.chosen)),
            "kept_float": "embeddings, final norm, output projection, last layer's q/k/v",
            "activation_levels": activation_max(),  # 127, or 63 on a CPU without VNNI (quantize/int8.py)
            "calibration": source, "selection": {"max_drift": selection.max_drift,
                                                 "mean_drift": selection.mean_drift, "budget": selection.budget,
                                                 "probes": selection.probes},
            "gate": gate.to_dict(), "beam_candidates_changed": beam_changes, "limits": limits, "warnings": notes}


def warnings(q) -> list[str]:
    """What the build says before it quantizes: a gate looser than the defaults, a calibration on random ids."""
    notes = [f"{line}: the int8 gate accepts more change than boundserve's defaults"
             for line in q.looser_than_defaults()]
    if not q.calibration:
        notes.append("quantize.calibration is empty: the layers are chosen and gated on random token ids, which "
                     "say little about the deployment's own texts; give a file of its tokenized samples")
    return notes


def beam_searcher(config, model: nn.Module, batches: list[tuple]):
    """A function running eager beam search (W and steps up to 4) on the first sample of each held-out batch with
    the model as it is: [R, k, S] candidate tokens, best first."""
    from compile.beam.generation_config import beam_rule, read_generation_config
    from compile.beam.module import BeamModule
    from worker.runtime.beam_node import BeamNode

    b = config.build_bounds
    width, steps = min(4, b.max_beam_width), min(4, b.max_new_tokens)
    rule = beam_rule(read_generation_config(config.model.path))
    node = BeamNode(BeamModule(model, rule, steps), b.resolved(), model.spec.vocab_size,
                    rule.early_stopping, rule.pad_id, str(next(model.parameters()).device))
    prompts = [batch[0][: int(batch[2][1] - batch[2][0])] for batch in batches]  # each batch's first segment
    prompts = [p[: b.max_prompt_tokens] for p in prompts]

    def run() -> torch.Tensor:
        lens = torch.tensor([len(p) for p in prompts[: b.max_beam_requests_per_batch]])
        return node(torch.cat(prompts[: len(lens)]), lens, width, steps, width).sequences
    return run


def changed_candidates(reference: torch.Tensor, quantized: torch.Tensor) -> dict:
    """How many of the float model's top-k beam candidates the quantized model does not return at all."""
    changed = sum(int(seq.tolist() not in got.tolist()) for ref, got in zip(reference, quantized) for seq in ref)
    return {"changed": changed, "candidates": reference.shape[0] * reference.shape[1],
            "width": reference.shape[1], "steps": reference.shape[2]}
