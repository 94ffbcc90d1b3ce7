"""transformers' repetition penalty for the beam node, as a pure tensor function.

generate() applies it to the log-probs of every beam (after log_softmax, as beam search does):
every token id that occurs in the beam's prompt or its new tokens so far gets log_prob * penalty
when negative, log_prob / penalty otherwise. The prompt part is one [R, V] mask per request,
shared by all beams; each beam adds its own (at most S - 1) new tokens.
"""

from __future__ import annotations

import torch
from torch import nn


class RepetitionPenalty(nn.Module):
    """The checkpoint's repetition_penalty (> 0, != 1), compiled into the node."""

    def __init__(self, penalty: float):
        super().__init__()
        if not penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
        self.penalty = float(penalty)

    def prompt_seen(self, prompt_ids: torch.Tensor, positions: torch.Tensor, num_requests: int,
                    vocab_size: int) -> torch.Tensor:
        """[R, V] bool: which token ids occur in each request's prompt (packed ids [T], positions [T])."""
        request = torch.cumsum((positions == 0).to(torch.int64), 0) - 1  # [T] request of each token
        seen = torch.zeros(num_requests, vocab_size, dtype=torch.bool, device=prompt_ids.device)
        return seen.index_put((request, prompt_ids), torch.ones_like(prompt_ids, dtype=torch.bool))

    def apply(self, log_probs: torch.Tensor, prompt_seen: torch.Tensor, running_tokens: torch.Tensor,
              step: int) -> torch.Tensor:
        """log_probs [R, Win, V]; running_tokens [R, Win, S] holds new tokens before `step` (1-based)."""
        r, win, vocab = log_probs.shape
        seen = prompt_seen[:, None, :].expand(r, win, vocab)
        if step > 1:
            new = running_tokens[:, :, : step - 1]  # [R, Win, step-1]
            seen = seen.scatter(-1, new, torch.ones_like(new, dtype=torch.bool))
        penalised = torch.where(log_probs < 0, log_probs * self.penalty, log_probs / self.penalty)
        return torch.where(seen, penalised, log_probs)
