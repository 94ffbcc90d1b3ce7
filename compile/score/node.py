"""ScoreNode: the worker-side face of the compiled scoring package.

Checks a batch against the compiled bounds (raising BoundsError before anything runs), lays out the
package's inputs and cuts its padded outputs down to the batch's samples, labels and k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from compile.score.module import pack_inputs
from shared.bounds import BoundsError


@dataclass(frozen=True)
class ScoreOutput:
    """Per-sample results of a scoring batch (float32 on CPU; ids int64)."""

    label_logits: torch.Tensor  # [B, N]
    label_logprobs: torch.Tensor  # [B, N] under the full vocabulary
    label_probs: torch.Tensor  # [B, N] softmax over the labels alone
    topk_ids: torch.Tensor  # [B, k]
    topk_logprobs: torch.Tensor  # [B, k]
    hidden: torch.Tensor  # [B, H] last-token hidden state after the final norm
    head: torch.Tensor | None  # [B, C] MLP head outputs, when the deployment has one


class ScoreNode:
    """Runs the compiled scoring package on a packed batch."""

    def __init__(self, package: Any, manifest: dict, device: str):
        self.package = package
        self.bounds = manifest["bounds"]
        self.vocab_size = manifest["model"]["vocab_size"]
        self.has_head = "head" in manifest["nodes"]["score"]["outputs"]
        self.device = torch.device(device)

    def __call__(self, input_ids: torch.Tensor, sample_lens: torch.Tensor, label_ids: torch.Tensor, top_k: int) -> ScoreOutput:
        self.check(input_ids, sample_lens, label_ids, top_k)
        num_samples = len(sample_lens)
        if num_samples == 1:  # the package is compiled for >= 2 samples: add a 1-token filler
            input_ids = torch.cat([input_ids, input_ids[:1]])
            sample_lens = torch.cat([sample_lens, sample_lens.new_ones(1)])
        args = self.pack(input_ids, sample_lens, label_ids)
        with torch.inference_mode():
            outputs = [t[:num_samples] for t in self.package(*args)]
        n, k = len(label_ids), top_k
        outputs = [t.cpu() for t in outputs]
        return ScoreOutput(
            label_logits=outputs[0][:, :n], label_logprobs=outputs[1][:, :n], label_probs=outputs[2][:, :n],
            topk_ids=outputs[3][:, :k], topk_logprobs=outputs[4][:, :k], hidden=outputs[5],
            head=outputs[6] if self.has_head else None,
        )

    def pack(self, input_ids, sample_lens, label_ids) -> tuple[torch.Tensor, ...]:
        args = pack_inputs(input_ids, sample_lens, label_ids, self.bounds["max_labels"])
        return tuple(t.to(self.device, non_blocking=True) for t in args)

    def check(self, input_ids, sample_lens, label_ids, top_k) -> None:
        b = self.bounds
        if input_ids.dim() != 1 or sample_lens.dim() != 1 or label_ids.dim() != 1:
            raise BoundsError("input_ids, sample_lens and label_ids must be 1-D tensors")
        _check(1 <= len(sample_lens) <= b["max_samples_per_batch"],
               f"{len(sample_lens)} samples in a batch; compiled for 1 to {b['max_samples_per_batch']}")
        shortest, longest = int(sample_lens.min()), int(sample_lens.max())
        _check(shortest >= 1, "every sample needs at least one token")
        _check(longest <= b["max_tokens_per_sample"],
               f"a sample of {longest} tokens; compiled for at most {b['max_tokens_per_sample']}")
        _check(int(sample_lens.sum()) == len(input_ids),
               f"sample lengths add up to {int(sample_lens.sum())} but {len(input_ids)} token ids were given")
        _check(len(input_ids) <= b["max_tokens_per_batch"],
               f"{len(input_ids)} tokens in a batch; compiled for at most {b['max_tokens_per_batch']}")
        _check(len(label_ids) <= b["max_labels"], f"{len(label_ids)} labels; compiled for at most {b['max_labels']}")
        _check(0 <= top_k <= b["max_top_k"], f"top_k = {top_k}; compiled for 0 to {b['max_top_k']}")
        for name, ids in (("token", input_ids), ("label token", label_ids)):
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
                raise BoundsError(f"a {name} id outside the vocabulary [0, {self.vocab_size})")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BoundsError(message)
