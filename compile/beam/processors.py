"""Logits processors of the beam node: the repetition penalty (compiled in) and prefix constraints
(whose tables are inputs of the node).

Repetition penalty (transformers', as a pure tensor function): generate() applies it to the
log-probs of every beam (after log_softmax, as beam search does): every token id that occurs in the
beam's prompt or its new tokens so far gets log_prob * penalty when negative, log_prob / penalty
otherwise. The prompt part is one [R, V] mask per request, shared by all beams; each beam adds its
own (at most S - 1) new tokens.

Constrained decoding for generative retrieval: beams only follow prefixes of valid sequences.
The valid sequences are a catalogue, data rather than code: shared/catalog packs the prefix trees of
the loaded catalogues into fixed-size tables (PrefixTables, shared/catalog/layout.py describes them)
that the node takes as inputs with each request's root row, so a new catalogue needs no rebuild;
only the table rows and `fan_out` (the most children of any node: the edges scanned per beam and
step) are compiled. On the request path `PrefixConstraint.mask` is a pure tensor function: allowed
next tokens of prefix p = {next token of every valid sequence that extends p} ∪ {EOS ids if p is
valid}; on the request's last step only tokens that complete a valid sequence (or EOS) are allowed,
so every returned candidate is a valid sequence. Disallowed tokens get -inf log-probability, as
transformers' prefix_allowed_tokens_fn does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from shared.catalog import CatalogBounds, build_trie, pack

TABLE_NAMES = ("child_start", "edge_token", "edge_child", "edge_ends", "terminal")
"""The node's table inputs, in order (after catalog_root)."""


class PrefixTables(NamedTuple):
    """The packed prefix tables (shared/catalog/layout.py), rows = compiled max nodes + 1 (the dead end)."""

    child_start: torch.Tensor  # [rows + 1] int32
    edge_token: torch.Tensor  # [rows] int32
    edge_child: torch.Tensor  # [rows] int32
    edge_ends: torch.Tensor  # [rows] bool
    terminal: torch.Tensor  # [rows] bool

    @classmethod
    def from_numpy(cls, arrays, device="cpu") -> "PrefixTables":
        return cls(*(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays))


def build_tables(sequences, vocab_size: int, max_len: int, max_nodes: int | None = None,
                 max_fanout: int | None = None) -> PrefixTables:
    """The tables of one catalogue of `sequences` (root row 0), sized for max_nodes (default: its own)."""
    trie = build_trie(sequences, vocab_size, max_len)
    bounds = CatalogBounds(max_nodes or trie.num_nodes, max_fanout or max(1, trie.fan_out))
    return PrefixTables.from_numpy(pack({"": trie}, bounds).arrays())


class PrefixConstraint(nn.Module):
    """Masks log-probs to valid continuations and tracks each beam's prefix-tree node; holds no
    tables (they are the node's inputs), only the compiled fan-out and the EOS ids."""

    def __init__(self, fan_out: int, eos_ids: tuple[int, ...]):
        super().__init__()
        if fan_out < 1:
            raise ValueError(f"fan_out must be >= 1, got {fan_out}")
        self.fan_out = int(fan_out)
        self.eos_ids = tuple(eos_ids)

    def start(self, roots: torch.Tensor) -> torch.Tensor:
        """[R, 1] int64: every request starts at the root row of its catalogue (roots [R])."""
        return roots.to(torch.int64)[:, None]

    def _edges(self, tables: PrefixTables, nodes: torch.Tensor):
        """nodes [R, W] -> edge slots [R, W, F] int64 and which of them exist [R, W, F] bool."""
        start = tables.child_start.index_select(0, nodes.reshape(-1)).long().reshape(nodes.shape)
        stop = tables.child_start.index_select(0, nodes.reshape(-1) + 1).long().reshape(nodes.shape)
        offsets = torch.arange(self.fan_out, device=nodes.device)
        slot = start[..., None] + offsets  # [R, W, F]
        exists = slot < stop[..., None]
        return torch.where(exists, slot, torch.zeros_like(slot)), exists

    @staticmethod
    def _gather(table: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, slot.reshape(-1)).reshape(slot.shape)

    def allowed(self, tables: PrefixTables, nodes: torch.Tensor, vocab_size: int,
                last_step: torch.Tensor) -> torch.Tensor:
        """[R, W, V] bool: tokens allowed after each beam's prefix (last_step: bool [])."""
        slot, exists = self._edges(tables, nodes)
        ok = exists & (self._gather(tables.edge_ends, slot) | ~last_step)
        token = torch.where(ok, self._gather(tables.edge_token, slot).long(), torch.full_like(slot, vocab_size))
        allowed = torch.zeros(*nodes.shape, vocab_size + 1, dtype=torch.bool, device=nodes.device)
        allowed = allowed.scatter(-1, token, torch.ones_like(ok))[..., :vocab_size]  # column V: the discard
        if self.eos_ids:
            ends = self._gather(tables.terminal, nodes)[..., None]  # [R, W, 1]
            eos = torch.zeros(vocab_size, dtype=torch.bool, device=nodes.device)
            eos[list(self.eos_ids)] = True
            allowed = allowed | (ends & eos)
        return allowed

    def mask(self, tables: PrefixTables, log_probs: torch.Tensor, nodes: torch.Tensor, step: int,
             num_steps: torch.Tensor) -> torch.Tensor:
        """log_probs [R, W, V] with -inf where the token would leave the valid set."""
        allowed = self.allowed(tables, nodes, log_probs.shape[-1], num_steps == step)
        return log_probs.masked_fill(~allowed, float("-inf"))

    def advance(self, tables: PrefixTables, nodes: torch.Tensor, parent: torch.Tensor,
                token: torch.Tensor) -> torch.Tensor:
        """The node of each new running beam: nodes [R, Win], parent/token [R, W] -> [R, W]; a token
        off every edge leads to the dead end (the tables' last row)."""
        from_node = torch.gather(nodes, 1, parent)  # [R, W]
        slot, exists = self._edges(tables, from_node)
        match = exists & (self._gather(tables.edge_token, slot).long() == token[..., None])  # [R, W, F]
        chosen = (match.long() * slot).sum(-1)  # [R, W]: a node's edge tokens are distinct, so <= 1 match
        child = self._gather(tables.edge_child, chosen).long()
        dead = tables.terminal.shape[0] - 1
        return torch.where(match.any(-1), child, torch.full_like(child, dead))


class RepetitionPenalty(nn.Module):
    """The checkpoint's repetition_penalty (> 0, != 1), compiled into the node."""

    def __init__(self, penalty: float):
        super().__init__()
        if not penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
        self.penalty = float(penalty)

    def prompt_seen(self, prompt_ids: torch.Tensor, cu_seqlens: torch.Tensor, num_requests: int,
                    vocab_size: int) -> torch.Tensor:
        """[R, V] bool: which token ids occur in each request's prompt (packed ids [T], prompt
        boundaries cu_seqlens [R+1]; rows past the last prompt are padding and count for none)."""
        rows = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
        request = torch.searchsorted(cu_seqlens[1:].to(torch.int64), rows, right=True)  # [T], padding: R
        seen = torch.zeros(num_requests + 1, vocab_size, dtype=torch.bool, device=prompt_ids.device)
        return seen.index_put((request, prompt_ids), torch.ones_like(prompt_ids, dtype=torch.bool))[:num_requests]

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
