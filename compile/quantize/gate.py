"""The accuracy gate of a quantized build: what quantization changed, on held-out calibration requests.

Each request is a list of samples scored on the same labels. Compared with the float model:
  max_label_logprob_drift   largest |Δ log P(label | sample)| over every sample and label (nats);
  mean_label_logprob_drift  its mean;
  top1_agreement            share of samples whose most likely next token is unchanged;
  rank_agreement            share of the pairs of items within a request whose order by the first label's
                            log-probability is unchanged (pairs tied in the float model are skipped) — what a
                            ranking service sees.
A build whose figures miss its limits is refused before anything is written, with the figures in the message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class GateFigures:
    """What quantization changed on the held-out requests (see the module docstring)."""

    max_label_logprob_drift: float
    mean_label_logprob_drift: float
    top1_agreement: float
    rank_agreement: float
    samples: int
    requests: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GateLimits:
    """The [quantize] limits a build must meet (shared/config.py: QuantizeConfig)."""

    max_label_logprob_drift: float
    mean_label_logprob_drift: float
    min_top1_agreement: float
    min_rank_agreement: float


class QuantizationRefused(ValueError):
    """The quantized model misses a limit of the gate on the held-out set: no artifacts are written."""


def pair_agreement(reference: torch.Tensor, quantized: torch.Tensor) -> tuple[int, int]:
    """Scores [B] of one request's items -> (pairs in the same order, pairs compared); float ties are skipped."""
    ref = reference[:, None] - reference[None, :]
    got = quantized[:, None] - quantized[None, :]
    upper = torch.triu(torch.ones_like(ref, dtype=torch.bool), diagonal=1) & (ref != 0)
    same = (torch.sign(ref) == torch.sign(got)) & upper
    return int(same.sum()), int(upper.sum())


def figures(reference: list[tuple[torch.Tensor, torch.Tensor]],
            quantized: list[tuple[torch.Tensor, torch.Tensor]]) -> GateFigures:
    """Per request (label log-probs [B, N], top-1 ids [B]) of the float and the quantized model."""
    drifts, agree, same_pairs, pairs, samples = [], 0, 0, 0, 0
    for (ref_lp, ref_top), (got_lp, got_top) in zip(reference, quantized):
        drifts.append((got_lp.float() - ref_lp.float()).abs().flatten())
        agree += int((got_top == ref_top).sum())
        samples += ref_top.numel()
        s, p = pair_agreement(ref_lp[:, 0].float(), got_lp[:, 0].float())
        same_pairs, pairs = same_pairs + s, pairs + p
    drift = torch.cat(drifts)
    return GateFigures(float(drift.max()), float(drift.mean()), agree / samples,
                       same_pairs / pairs if pairs else 1.0, samples, len(reference))


def check(result: GateFigures, limits: GateLimits) -> None:
    """Raise QuantizationRefused naming every limit the figures miss."""
    misses = []
    if result.max_label_logprob_drift > limits.max_label_logprob_drift:
        misses.append(f"max label log-prob drift {result.max_label_logprob_drift:.4g} nats > "
                      f"{limits.max_label_logprob_drift}")
    if result.mean_label_logprob_drift > limits.mean_label_logprob_drift:
        misses.append(f"mean label log-prob drift {result.mean_label_logprob_drift:.4g} nats > "
                      f"{limits.mean_label_logprob_drift}")
    if result.top1_agreement < limits.min_top1_agreement:
        misses.append(f"top-1 agreement {result.top1_agreement:.4f} < {limits.min_top1_agreement}")
    if result.rank_agreement < limits.min_rank_agreement:
        misses.append(f"rank agreement {result.rank_agreement:.4f} < {limits.min_rank_agreement}")
    if misses:
        raise QuantizationRefused(
            f"the quantized model misses the [quantize] gate on {result.requests} held-out requests "
            f"({result.samples} samples): " + "; ".join(misses)
            + ". Loosen the limits, calibrate on the deployment's own texts, or keep more layers in float.")
