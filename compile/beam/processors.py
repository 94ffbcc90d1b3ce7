"""Logits processors of the beam node, compiled into it: the repetition penalty and prefix constraints.

Repetition penalty (transformers', as a pure tensor function): generate() applies it to the
log-probs of every beam (after log_softmax, as beam search does): every token id that occurs in the
beam's prompt or its new tokens so far gets log_prob * penalty when negative, log_prob / penalty
otherwise. The prompt part is one [R, V] mask per request, shared by all beams; each beam adds its
own (at most S - 1) new tokens.

Constrained decoding for generative retrieval: beams only follow prefixes of valid sequences.

Offline, the valid sequences (one per line: token ids separated by spaces or commas; or a .npy
int array [N, L] padded with -1) become a prefix tree stored as flat tensors, nodes numbered depth
by depth (node 0 = the empty prefix, the last node = a dead end):
    child_start [nodes + 1] int32   CSR: the edges of node n are child_start[n] : child_start[n+1]
    edge_token  [E] int32           the token of each edge
    edge_child  [E] int32           the node it leads to
    edge_ends   [E] bool            that node is a complete valid sequence
    terminal    [nodes] bool        the node is a complete valid sequence (EOS may follow)
On the request path `PrefixConstraint.mask` is a pure tensor function: allowed next tokens of
prefix p = {next token of every valid sequence that extends p} ∪ {EOS ids if p is valid}; on the
request's last step only tokens that complete a valid sequence (or EOS) are allowed, so every
returned candidate is a valid sequence. Disallowed tokens get -inf log-probability, as transformers'
prefix_allowed_tokens_fn does. `fan_out` (most children of any node) bounds the work per beam.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


def read_sequences(path: str | Path) -> list[list[int]]:
    """Valid sequences from a text file (ids separated by spaces or commas) or a .npy array."""
    path = Path(path)
    if path.suffix == ".npy":
        rows = np.load(path)
        return [[int(t) for t in row if t >= 0] for row in rows]
    sequences = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.replace(",", " ").strip()
        if not line or line.startswith("#"):
            continue
        try:
            sequences.append([int(t) for t in line.split()])
        except ValueError:
            raise ValueError(f"{path}:{number}: expected token ids separated by spaces, got {line[:60]!r}") from None
    return sequences


def build_tables(sequences: list[list[int]] | np.ndarray, vocab_size: int, max_len: int) -> dict[str, torch.Tensor]:
    """The prefix tree of `sequences` as the flat tensors described above (numpy, vectorised)."""
    rows = _as_padded(sequences, vocab_size, max_len)  # [N, L] int64, -1 padded, sorted, unique
    lens = (rows >= 0).sum(1)
    n, width = rows.shape
    first_diff = np.zeros(n, dtype=np.int64)  # first column where row i differs from row i - 1
    if n > 1:
        differs = rows[1:] != rows[:-1]
        first_diff[1:] = np.where(differs.any(1), differs.argmax(1), width)
    node_of_row = np.zeros(n, dtype=np.int64)  # the node of each row's prefix at the current depth
    parents, tokens, children, terminal_nodes = [], [], [], [node_of_row[lens == 0]]
    next_id = 1
    for depth in range(width):
        has = lens > depth
        starts = has & (first_diff <= depth)
        child_of_row = next_id + np.cumsum(starts) - 1
        parents.append(node_of_row[starts])
        tokens.append(rows[starts, depth])
        children.append(child_of_row[starts])
        next_id += int(starts.sum())
        node_of_row = np.where(has, child_of_row, -1)
        terminal_nodes.append(node_of_row[lens == depth + 1])
    num_nodes = next_id + 1  # + the dead end
    parent = np.concatenate(parents)
    child = np.concatenate(children)
    terminal = np.zeros(num_nodes, dtype=bool)
    terminal[np.concatenate(terminal_nodes)] = True
    child_start = np.searchsorted(parent, np.arange(num_nodes + 1))
    return {
        "child_start": torch.from_numpy(child_start.astype(np.int32)),
        "edge_token": torch.from_numpy(np.concatenate(tokens).astype(np.int32)),
        "edge_child": torch.from_numpy(child.astype(np.int32)),
        "edge_ends": torch.from_numpy(terminal[child]),
        "terminal": torch.from_numpy(terminal),
    }


def _as_padded(sequences, vocab_size: int, max_len: int) -> np.ndarray:
    if isinstance(sequences, np.ndarray):
        rows = sequences.astype(np.int64)
    else:
        if not sequences:
            raise ValueError("constraints: the set of valid sequences is empty")
        width = max(len(s) for s in sequences)
        rows = np.full((len(sequences), width), -1, dtype=np.int64)
        for i, s in enumerate(sequences):
            rows[i, : len(s)] = s
    lens = (rows >= 0).sum(1)
    if (lens == 0).any() or (rows[:, :-1] < 0).__and__(rows[:, 1:] >= 0).any():
        raise ValueError("constraints: every valid sequence needs at least one token and no gaps")
    if rows.shape[1] > max_len:
        raise ValueError(f"constraints: a valid sequence has {rows.shape[1]} tokens; max_new_tokens is {max_len}")
    if rows.max() >= vocab_size:
        raise ValueError(f"constraints: token id {int(rows.max())} is outside the vocabulary [0, {vocab_size})")
    return np.unique(rows, axis=0)  # sorted lexicographically; -1 pads sort first, so prefixes come first


class PrefixConstraint(nn.Module):
    """Masks log-probs to valid continuations and tracks each beam's prefix-tree node."""

    def __init__(self, tables: dict[str, torch.Tensor], eos_ids: tuple[int, ...]):
        super().__init__()
        for name, tensor in tables.items():
            self.register_buffer(name, tensor)
        counts = tables["child_start"][1:] - tables["child_start"][:-1]
        self.fan_out = max(1, int(counts.max()))
        self.dead = int(tables["terminal"].numel()) - 1
        self.eos_ids = tuple(eos_ids)

    def start(self, num_requests: int, device) -> torch.Tensor:
        """[R, 1] int64: every request starts at the root."""
        return torch.zeros(num_requests, 1, dtype=torch.int64, device=device)

    def _edges(self, nodes: torch.Tensor):
        """nodes [R, W] -> edge slots [R, W, F] int64 and which of them exist [R, W, F] bool."""
        start = self.child_start.index_select(0, nodes.reshape(-1)).long().reshape(nodes.shape)
        stop = self.child_start.index_select(0, nodes.reshape(-1) + 1).long().reshape(nodes.shape)
        offsets = torch.arange(self.fan_out, device=nodes.device)
        slot = start[..., None] + offsets  # [R, W, F]
        exists = slot < stop[..., None]
        return torch.where(exists, slot, torch.zeros_like(slot)), exists

    def _gather(self, table: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, slot.reshape(-1)).reshape(slot.shape)

    def allowed(self, nodes: torch.Tensor, vocab_size: int, last_step: torch.Tensor) -> torch.Tensor:
        """[R, W, V] bool: tokens allowed after each beam's prefix (last_step: bool [])."""
        slot, exists = self._edges(nodes)
        ok = exists & (self._gather(self.edge_ends, slot) | ~last_step)
        token = torch.where(ok, self._gather(self.edge_token, slot).long(), torch.full_like(slot, vocab_size))
        allowed = torch.zeros(*nodes.shape, vocab_size + 1, dtype=torch.bool, device=nodes.device)
        allowed = allowed.scatter(-1, token, torch.ones_like(ok))[..., :vocab_size]  # column V: the discard
        if self.eos_ids:
            ends = self._gather(self.terminal, nodes)[..., None]  # [R, W, 1]
            eos = torch.zeros(vocab_size, dtype=torch.bool, device=nodes.device)
            eos[list(self.eos_ids)] = True
            allowed = allowed | (ends & eos)
        return allowed

    def mask(self, log_probs: torch.Tensor, nodes: torch.Tensor, step: int, num_steps: torch.Tensor) -> torch.Tensor:
        """log_probs [R, W, V] with -inf where the token would leave the valid set."""
        allowed = self.allowed(nodes, log_probs.shape[-1], num_steps == step)
        return log_probs.masked_fill(~allowed, float("-inf"))

    def advance(self, nodes: torch.Tensor, parent: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The node of each new running beam: nodes [R, Win], parent/token [R, W] -> [R, W]."""
        from_node = torch.gather(nodes, 1, parent)  # [R, W]
        slot, exists = self._edges(from_node)
        match = exists & (self._gather(self.edge_token, slot).long() == token[..., None])  # [R, W, F]
        chosen = (match.long() * slot).sum(-1)  # [R, W]: a node's edge tokens are distinct, so <= 1 match
        child = self._gather(self.edge_child, chosen).long()
        return torch.where(match.any(-1), child, torch.full_like(child, self.dead))

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
