"""The bounded beam-search node: one packed prefill of R prompts, then S decode steps at width W.

Exported inputs (T packed prompt tokens, R requests, L = longest prompt, W beams):
    prompt_ids   [T] int64    all prompts concatenated, padded to a multiple of the attention block
    positions    [T] int64    position of each token inside its own prompt (padding: any)
    cu_seqlens   [R+1] int32  prompt boundaries (0, L0, L0+L1, ...)
    prompt_index [R, L] int64 packed row of each prompt's token l (padding rows point at row 0)
    prompt_valid [R, L] bool  which of those are real tokens
    beam_slots   [W] int64    only its length matters: the beam width W of this call (1..max)
    num_steps    [] int64     the request's max_new_tokens (1..S); later compiled steps change nothing
    early_all    [] bool      early_stopping is True (forced for W = 1, where generate() is greedy)
With constrained decoding (built with [beam] max_catalog_nodes > 0) six more inputs follow, the
catalogue as data (compile/beam/processors.py; shared/catalog/layout.py lays the tables out), so a
new catalogue runs on the same package:
    catalog_root [R] int64    the root row of the catalogue each request names
    child_start  [N+2] int32, edge_token [N+1] int32, edge_child [N+1] int32, edge_ends [N+1] bool,
    terminal [N+1] bool       N = max_catalog_nodes, fixed sizes (row N is the dead end)
Outputs: tokens [R, W, S] int64, scores [R, W] float32, lengths [R, W] int64: every request's
finished hypotheses, best first (transformers' sequences / sequences_scores order).

Serving smaller requests: W, R and the prompt sizes are dynamic dimensions of one package, so any
W <= max_beam_width runs at its own width (selection depends on W, so it is never emulated by a
wider beam); W = 1 follows generate(num_beams=1), i.e. greedy search, which equals beam search with
early_stopping=True at width 1 (the runtime sets early_all). S is compiled (the loop is unrolled
S times): a request with fewer steps runs all S compiled steps and keeps the state of its last one,
so a node compiled for S = 4 costs the same for max_new_tokens = 2 (build with the S you serve).
The dynamic dimensions are declared with min 1; Inductor's opt-in input check
(AOTI_RUNTIME_CHECK_INPUTS=1) assumes >= 2 and would refuse R = 1 or W = 1, so leave it off for
this package: size-1 calls are tested against the eager module and transformers.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from compile.attention import KeyPool, pool_mask
from worker.runtime.layout import CPU_BLOCK, block_for, padded
from compile.beam.decode import decode, prompt_kv, reorder_suffix
from compile.beam.processors import TABLE_NAMES, PrefixConstraint, PrefixTables, RepetitionPenalty, build_tables
from compile.beam.search import BeamRule, beam_step, heuristic_divisor, initial_state, select_state
from compile.context import BuildContext
from compile.model import Transformer, last_token_index, prefill
from shared.catalog import CatalogBounds


INPUT_NAMES = (
    "prompt_ids", "positions", "cu_seqlens", "prompt_index", "prompt_valid", "beam_slots", "num_steps", "early_all",
)
CATALOG_INPUT_NAMES = ("catalog_root", *TABLE_NAMES)
"""The constrained node's inputs after INPUT_NAMES."""


class BeamModule(nn.Module):
    """Transformer + beam loop; the `model` attribute name is shared with the scoring node."""

    def __init__(self, model: Transformer, rule: BeamRule, max_steps: int, constraint: PrefixConstraint | None = None,
                 pool: KeyPool | None = None):
        super().__init__()
        self.model = model
        self.pool = pool  # the compiled sizes; None (eager use): fitted to each call
        self.rule = rule
        self.max_steps = max_steps
        self.constraint = constraint
        self.penalty = RepetitionPenalty(rule.repetition_penalty) if rule.repetition_penalty != 1.0 else None

    def forward(self, prompt_ids, positions, cu_seqlens, prompt_index, prompt_valid, beam_slots, num_steps,
                early_all, catalog_root=None, child_start=None, edge_token=None, edge_child=None, edge_ends=None,
                terminal=None):
        model, rule = self.model, self.rule
        tables = PrefixTables(child_start, edge_token, edge_child, edge_ends, terminal)
        r, w = prompt_index.shape[0], beam_slots.shape[0]
        t = prompt_ids.shape[0]
        pool = self.pool or KeyPool.fitting(t, r + 1, CPU_BLOCK)
        # each prompt causally; the rows past the last prompt (block padding) form one more segment
        mask = pool_mask(pool, cu_seqlens, torch.full_like(cu_seqlens[1:], -1, dtype=torch.int64), t, t)
        hidden, keys, values = prefill(model, prompt_ids, positions, mask)  # [T, H]
        last = last_token_index(cu_seqlens)  # [R]
        logits = model.logits(hidden.index_select(0, last))[:, None, :]  # [R, 1, V] float32
        prompt = (prompt_kv(keys, prompt_index), prompt_kv(values, prompt_index), prompt_valid)
        prompt_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # [R]
        state = initial_state(r, w, self.max_steps, rule.pad_id, prompt_ids.device)
        nodes = None if self.constraint is None else self.constraint.start(catalog_root)  # [R, 1]
        seen = None if self.penalty is None else self.penalty.prompt_seen(prompt_ids, cu_seqlens, r, logits.shape[-1])
        is_greedy = torch.ones_like(beam_slots).sum() == 1  # bool []: a tensor, so W stays dynamic
        suffix = None
        for step in range(1, self.max_steps + 1):
            if step > 1:
                tokens = state.running_tokens[:, :, step - 2]  # [R, W] the token chosen last step
                pos = (prompt_lens + (step - 2))[:, None].expand(r, w)  # [R, W]
                logits, suffix = decode(model, tokens, pos, prompt, suffix)  # [R, W, V]
            log_probs = self._log_probs(logits, seen, state.running_tokens, step, is_greedy)
            if nodes is not None:
                log_probs = self.constraint.mask(tables, log_probs, nodes, step, num_steps)
            divisor = heuristic_divisor(rule, step, num_steps)
            new, parent = beam_step(state, log_probs, step, w, rule, num_steps == step, early_all, divisor)
            if nodes is not None:
                nodes = self.constraint.advance(tables, nodes, parent, new.running_tokens[:, :, step - 1])
            state = select_state(num_steps >= step, new, state)
            if suffix is not None and step < self.max_steps:
                suffix = reorder_suffix(suffix, parent)
        return state.finished_tokens, state.finished_scores, state.finished_lens

    def _log_probs(self, logits, seen, running_tokens, step: int, is_greedy):
        """Processed log-probs [R, Win, V]. transformers' beam search applies the repetition penalty to
        log-probs, its greedy search (W = 1) to logits; both are followed exactly."""
        log_probs = F.log_softmax(logits, dim=-1)
        if seen is None:
            return log_probs
        beam = self.penalty.apply(log_probs, seen, running_tokens, step)
        greedy = F.log_softmax(self.penalty.apply(logits, seen, running_tokens, step), dim=-1)
        return torch.where(is_greedy, greedy, beam)


def example_inputs(vocab_size: int, block: int, device: str = "cpu",
                   catalog: CatalogBounds | None = None) -> tuple[torch.Tensor, ...]:
    """Two prompts (3 and 5 tokens), four beams, used to trace the node; the tokens padded to two
    blocks (a block count of 1 would be specialised). With `catalog`: both requests at the root of
    a one-sequence catalogue in tables of the compiled size (their values do not shape the trace)."""
    lens = [3, 5]
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    ids = (torch.arange(2 * block, dtype=torch.int64) * 7 + 3) % vocab_size
    positions = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(2 * block - 8, dtype=torch.int64)])
    index = torch.tensor([[0, 1, 2, 0, 0], [3, 4, 5, 6, 7]], dtype=torch.int64)
    valid = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    slots = torch.zeros(4, dtype=torch.int64)
    num_steps = torch.tensor(2, dtype=torch.int64)
    early = torch.tensor(False)
    tables = ()
    if catalog is not None:
        roots = torch.zeros(2, dtype=torch.int64)
        tables = (roots, *build_tables([[3 % vocab_size]], vocab_size, 1, catalog.max_nodes, catalog.max_fanout))
    return tuple(t.to(device) for t in (ids, positions, cu, index, valid, slots, num_steps, early, *tables))


def dynamic_shapes(max_prompt_tokens: int, max_requests: int, max_beams: int, block: int,
                   constrained: bool = False) -> tuple:
    """Tokens (whole blocks), requests, prompt length and beam width are dynamic; the catalogue's
    tables (constrained) have the fixed compiled size, its roots one per request.

    Each range reaches past the example's size (2 requests, 4 beams, 5 tokens, 2 blocks) even when
    the deployment's bound is smaller, or export would specialise it; the runtime refuses anything
    beyond the deployment's own bounds before the package runs.
    """
    max_prompt_tokens, max_requests, max_beams = max(max_prompt_tokens, 6), max(max_requests, 3), max(max_beams, 5)
    tokens = block * Dim("row_blocks", min=1, max=blocks_per_batch(max_prompt_tokens, max_requests, block))
    requests = Dim("requests", min=1, max=max_requests)
    length = Dim("prompt_len", min=1, max=max_prompt_tokens)
    beams = Dim("beams", min=1, max=max_beams)
    shapes = ({0: tokens}, {0: tokens}, {0: requests + 1}, {0: requests, 1: length}, {0: requests, 1: length},
              {0: beams}, None, None)
    if constrained:
        shapes += ({0: requests}, *[None] * len(TABLE_NAMES))
    return shapes


def beam_pool(max_prompt_tokens: int, max_requests: int, device: str) -> KeyPool:
    """The prompts' key pool as dynamic_shapes allows it: the most blocks of packed prompt tokens,
    one segment per request and one for the rows past the last prompt (the block padding)."""
    block = block_for(device)
    max_prompt_tokens, max_requests = max(max_prompt_tokens, 6), max(max_requests, 3)
    return KeyPool(block, blocks_per_batch(max_prompt_tokens, max_requests, block) * block, max_requests + 1)


def blocks_per_batch(max_prompt_tokens: int, max_requests: int, block: int) -> int:
    """The most blocks of packed prompt tokens, past the example's 2."""
    return max(3, padded(max_prompt_tokens * max_requests, block) // block)


def export_beam_node(module: BeamModule, max_prompt_tokens: int, max_requests: int, max_beams: int,
                     device: str = "cpu", catalog: CatalogBounds | None = None) -> torch.export.ExportedProgram:
    """torch.export the node with the dynamic dimensions above (its key pool sized for them); a
    constrained module (module.constraint) takes catalogue tables of `catalog`'s size."""
    if (module.constraint is None) != (catalog is None):
        raise ValueError("a constrained beam module is exported with its catalogue bounds, "
                         "an unconstrained one without")
    module.pool = module.pool or beam_pool(max_prompt_tokens, max_requests, device)
    block = module.pool.block
    args = example_inputs(module.model.spec.vocab_size, block, device, catalog)
    shapes = dynamic_shapes(max_prompt_tokens, max_requests, max_beams, block, catalog is not None)
    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)


def build(ctx: BuildContext) -> tuple[nn.Module, torch.export.ExportedProgram, dict]:
    """Node builder: the beam node of ctx's checkpoint under ctx.config's bounds."""

    bounds = ctx.config.build_bounds
    inputs = ctx.beam
    assert inputs is not None, "the beam node is built only with [beam] enabled, whose inputs check_inputs read"
    rule, catalog = inputs.rule, inputs.catalog
    constraint = None if catalog is None else PrefixConstraint(catalog.max_fanout, rule.eos_ids)
    pool = beam_pool(bounds.max_prompt_tokens, bounds.max_beam_requests_per_batch, ctx.device)
    module = BeamModule(ctx.model, rule, bounds.max_new_tokens, constraint, pool).to(ctx.device)
    program = export_beam_node(module, bounds.max_prompt_tokens, bounds.max_beam_requests_per_batch,
                               bounds.max_beam_width, ctx.device, catalog)
    facts = {
        "inputs": list(INPUT_NAMES) + (list(CATALOG_INPUT_NAMES) if catalog else []),
        "outputs": ["tokens", "scores", "lengths"], "max_steps": bounds.max_new_tokens,
        "eos_ids": list(rule.eos_ids), "pad_id": rule.pad_id, "length_penalty": rule.length_penalty,
        "early_stopping": rule.early_stopping, "repetition_penalty": rule.repetition_penalty,
        "constrained": catalog is not None, "attention_block": pool.block,
        "max_catalog_nodes": catalog.max_nodes if catalog else 0,
        "max_catalog_fanout": catalog.max_fanout if catalog else 0,
    }
    return module, program, facts
