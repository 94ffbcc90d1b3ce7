"""transformers used as a careful engineer would: the baselines our nodes are compared with.

Scoring (samples of different lengths, the logits at each sample's last token):
  careful  the whole request as one left-padded batch, positions from the mask, inference mode,
           only the last position projected (logits_to_keep=1);
  best     the same, but samples sorted by length and run in micro-batches of `micro_batch`
           samples, so that little padding is computed (the bench picks the fastest size).
Either runs its float32 linear layers on torch's default GEMM (MKL's sgemm on x86, which takes an
AVX2 path on AMD CPUs) or, inside `linears_on(model, "onednn")`, on oneDNN's matmul: the kernel our
float32 node uses (compile/linear.py), so that a ratio against it shows what the engine adds beyond
the library.
Beam search: generate(num_beams=W, do_sample=False) on a left-padded batch of prompts (one prompt
for single-request latency, several for throughput).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from compile.linear import GemmBackend, linear


def left_padded(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, Lmax] with each row right-aligned, and the attention mask [B, Lmax] (on the rows' device)."""
    width, device = max(len(r) for r in rows), rows[0].device
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens):] = tokens
        mask[row, width - len(tokens):] = 1
    return ids, mask


@torch.inference_mode()
def careful(model, samples: list[torch.Tensor], pad_id: int) -> torch.Tensor:
    """Left-padded batch, position ids from the mask, only the last position projected -> [B, V] float32."""
    ids, mask = left_padded(samples, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    return out.logits[:, -1].float()


def length_sorted_chunks(lengths: list[int], micro_batch: int) -> list[list[int]]:
    """Sample indices sorted by length, cut into runs of micro_batch (neighbours differ least)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i:i + micro_batch] for i in range(0, len(order), micro_batch)]


@torch.inference_mode()
def best(model, samples: list[torch.Tensor], pad_id: int, micro_batch: int) -> torch.Tensor:
    """careful() on length-sorted micro-batches; rows back in the request's order -> [B, V] float32."""
    out = [None] * len(samples)
    for chunk in length_sorted_chunks([len(s) for s in samples], micro_batch):
        logits = careful(model, [samples[i] for i in chunk], pad_id)
        for row, index in enumerate(chunk):
            out[index] = logits[row]
    return torch.stack(out)


@torch.inference_mode()
def beams(model, prompts: list[torch.Tensor], pad_id: int, num_beams: int, steps: int, k: int):
    """generate(num_beams=W) for a batch of prompts -> tokens [R, k, S] (new tokens only), scores [R, k]."""
    ids, mask = left_padded(prompts, pad_id)
    out = model.generate(ids, attention_mask=mask, num_beams=num_beams, num_return_sequences=k,
                         max_new_tokens=steps, do_sample=False, return_dict_in_generate=True,
                         output_scores=True, pad_token_id=pad_id)
    tokens = out.sequences[:, ids.shape[1]:]
    tokens = torch.nn.functional.pad(tokens, (0, steps - tokens.shape[1]), value=pad_id)  # all stopped early
    return tokens.reshape(len(prompts), k, steps), out.sequences_scores.float().reshape(len(prompts), k)


def rescore(model, prompt: torch.Tensor, sequence: torch.Tensor) -> float:
    """The model's score of `sequence` [n] after `prompt` [L], as generate() ranks beams (length_penalty 1): the sum
    of the new tokens' log-probabilities over their count."""
    prompt, sequence = prompt.cpu(), sequence.cpu()
    with torch.inference_mode():
        logits = model(torch.cat([prompt, sequence])[None].to(model.device)).logits[0].float().cpu()
    logprobs = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)  # [n, V]: the distributions the tokens drew from
    return float(logprobs.gather(1, sequence[:, None]).sum()) / len(sequence)


@contextlib.contextmanager
def linears_on(model, backend: GemmBackend) -> Iterator[None]:
    """While inside, every nn.Linear of `model` (the vocabulary projection too) multiplies with
    `backend`: "onednn" is oneDNN's matmul on the plain weight, as our float32 node calls it;
    "aten" leaves transformers as it is."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)] if backend != "aten" else []
    for module in linears:
        module.forward = functools.partial(_linear_forward, module, backend)  # shadows nn.Linear.forward
    try:
        yield
    finally:
        for module in linears:
            del module.forward


def _linear_forward(module: torch.nn.Linear, backend: GemmBackend, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] -> [..., out] on `backend` (it takes rows [N, in])."""
    out = linear(x.reshape(-1, x.shape[-1]), module.weight, module.bias, backend)
    return out.reshape(*x.shape[:-1], out.shape[-1])
