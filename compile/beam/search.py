"""Beam search selection as pure tensor functions, following transformers' generate() rule exactly.

One step, per request (R requests, W beams, K = max(2, 1 + number of EOS ids) * W candidates kept;
the vocabulary must hold at least K tokens, which the build checks for the largest W):
  1. add each beam's running score to its next-token log-probs and take the top K of W·V;
  2. the best W candidates that did not stop (EOS, or the last step) become the running beams;
  3. candidates among the top W that did stop enter the finished list with score
     cumulative_logprob / generated_length ** length_penalty, which keeps its best W;
  4. the early-stopping heuristic decides whether the request can still improve.
Floating-point operations are done in the order transformers uses, so scores agree bit for bit
in eager mode. Finished lists are sorted by score, best first: the first k are the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

NEG = -1.0e9  # transformers' "impossible" score; kept identical so that ties resolve the same way


@dataclass(frozen=True)
class BeamRule:
    """The generation options the selection depends on (from the checkpoint's generation_config)."""

    eos_ids: tuple[int, ...]
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True | False | "never"
    pad_id: int = 0
    repetition_penalty: float = 1.0  # applied by the node before selection (compile/beam/processors.py)

    def __post_init__(self):
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")

    def beams_to_keep(self, num_beams: int) -> int:
        """K: candidates kept per step so that W beams can always continue past EOS."""
        return max(2, 1 + len(self.eos_ids)) * num_beams


class BeamState(NamedTuple):
    """Per-request beam state; Win = 1 before the first step (every beam is the prompt)."""

    running_scores: torch.Tensor  # [R, Win] float32 cumulative log-probs
    running_tokens: torch.Tensor  # [R, Win, S] int64 new tokens, pad after the current step
    finished_scores: torch.Tensor  # [R, W] float32, length-penalised, best first
    finished_tokens: torch.Tensor  # [R, W, S] int64
    finished_lens: torch.Tensor  # [R, W] int64 new tokens incl. EOS
    is_finished: torch.Tensor  # [R, W] bool: slot holds a real finished hypothesis
    can_improve: torch.Tensor  # [R, 1] bool: early-stopping heuristic not yet satisfied


def initial_state(num_requests: int, num_beams: int, max_steps: int, pad_id: int, device) -> BeamState:
    """The state before step 1: one running beam (the prompt) per request, nothing finished."""
    r, w, s = num_requests, num_beams, max_steps
    return BeamState(
        running_scores=torch.zeros(r, 1, dtype=torch.float32, device=device),
        running_tokens=torch.full((r, 1, s), pad_id, dtype=torch.int64, device=device),
        finished_scores=torch.full((r, w), NEG, dtype=torch.float32, device=device),
        finished_tokens=torch.full((r, w, s), pad_id, dtype=torch.int64, device=device),
        finished_lens=torch.zeros(r, w, dtype=torch.int64, device=device),
        is_finished=torch.zeros(r, w, dtype=torch.bool, device=device),
        can_improve=torch.ones(r, 1, dtype=torch.bool, device=device),
    )


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather rows along dim 1: x [R, N, ...], index [R, M] -> [R, M, ...].

    (torch.gather with an expanded index: take_along_dim's broadcasting pins dynamic sizes in export.)
    """
    trailing = x.shape[2:]
    index = index.reshape(*index.shape, *([1] * len(trailing))).expand(*index.shape, *trailing)
    return torch.gather(x, 1, index)


def beam_step(
    state: BeamState, log_probs: torch.Tensor, step: int, num_beams: int, rule: BeamRule,
    stop_all: torch.Tensor, early_all: torch.Tensor, best_divisor: torch.Tensor | float,
) -> tuple[BeamState, torch.Tensor]:
    """Advance one step. log_probs [R, Win, V] (processed); step is 1-based.

    stop_all: bool [] true on the request's last step (every candidate stops there).
    early_all: bool [] true when early_stopping is True (also used for W = 1, i.e. greedy).
    best_divisor: best_length ** length_penalty for the early-stopping heuristic (heuristic_divisor).
    Returns the new state and parent [R, W]: the index of each new running beam's parent beam.
    """
    r, win, _ = log_probs.shape
    keep = rule.beams_to_keep(num_beams)
    # The global top K of W·V candidates lie within each beam's own top K, so select per beam first
    # (rows run in parallel, V-wide work is never flattened) and then among W·K; the values are
    # transformers' own sums log_prob + running score, bit for bit.
    beam_top, beam_token = torch.topk(log_probs, keep, dim=-1)  # [R, Win, K]
    acc = (beam_top + state.running_scores[:, :, None]).reshape(r, win * keep)  # [R, Win*K]
    top_scores, top_index = torch.topk(acc, keep)  # [R, K], sorted best first
    parent = top_index // keep
    token = torch.gather(beam_token.reshape(r, win * keep), 1, top_index)  # [R, K]
    column = torch.arange(state.running_tokens.shape[-1], device=token.device) == step - 1  # [S]
    tokens = torch.where(column, token[:, :, None], take(state.running_tokens, parent))  # [R, K, S]
    hits = _stops(token, rule.eos_ids) | stop_all  # [R, K]

    running = top_scores + hits.to(torch.float32) * NEG
    next_index = torch.topk(running, num_beams)[1]  # [R, W]
    state = state._replace(
        running_scores=take(running, next_index),
        running_tokens=take(tokens, next_index),
    )
    state = _update_finished(state, top_scores, tokens, hits, step, num_beams, rule, early_all)
    state = state._replace(can_improve=_still_improvable(state, best_divisor))
    return state, take(parent, next_index)


def _stops(token: torch.Tensor, eos_ids: tuple[int, ...]) -> torch.Tensor:
    """[R, K] bool: the candidate's new token is an end-of-sequence id."""
    hit = torch.zeros_like(token, dtype=torch.bool)
    for eos in eos_ids:
        hit = hit | (token == eos)
    return hit


def _update_finished(state, top_scores, tokens, hits, step, num_beams, rule, early_all) -> BeamState:
    """Merge the stopped top-W candidates into the finished list, keeping its best W."""
    keep = top_scores.shape[1]
    in_top_w = torch.arange(keep, device=hits.device) < num_beams  # [K]
    just_finished = hits & in_top_w  # [R, K]
    cand = top_scores / (float(step) ** rule.length_penalty)
    full = state.is_finished.all(dim=-1, keepdim=True) & early_all  # [R, 1]
    cand = cand + full.to(torch.float32) * NEG
    cand = cand + (~state.can_improve).to(torch.float32) * NEG
    cand = cand + (~just_finished).to(torch.float32) * NEG
    scores = torch.cat((state.finished_scores, cand), dim=1)  # [R, W+K]
    best = torch.topk(scores, num_beams)[1]  # [R, W]
    lens = torch.cat((state.finished_lens, torch.full_like(top_scores, step, dtype=torch.int64)), dim=1)
    return state._replace(
        finished_scores=take(scores, best),
        finished_tokens=take(torch.cat((state.finished_tokens, tokens), dim=1), best),
        finished_lens=take(lens, best),
        is_finished=take(torch.cat((state.is_finished, just_finished), dim=1), best),
    )


def _still_improvable(state: BeamState, best_divisor: torch.Tensor | float) -> torch.Tensor:
    """transformers' heuristic: can the best running beam still beat the worst finished one?"""
    best_running = state.running_scores[:, :1] / best_divisor  # [R, 1]
    worst = state.finished_scores.min(dim=1, keepdim=True)[0]  # [R, 1]
    worst = torch.where(state.is_finished, worst, torch.full_like(state.finished_scores, NEG))  # [R, W]
    return state.can_improve & (best_running > worst).any(dim=-1, keepdim=True)


def heuristic_divisor(rule: BeamRule, step: int, num_steps: torch.Tensor) -> torch.Tensor | float:
    """best_length ** length_penalty; transformers assumes max_length for "never" with a positive
    penalty (num_steps: int64 [], the request's max_new_tokens), else the current length."""
    if rule.early_stopping == "never" and rule.length_penalty > 0.0:
        return num_steps.to(torch.float64).pow(rule.length_penalty).to(torch.float32)
    return float(step) ** rule.length_penalty


def select_state(active: torch.Tensor, new: BeamState, old: BeamState) -> BeamState:
    """Keep `old` where a request has already run all its steps (active is bool [])."""
    if old.running_scores.shape != new.running_scores.shape:
        return new  # only step 1 changes Win, and step 1 always runs
    return BeamState(*(torch.where(active, n, o) for n, o in zip(new, old)))
