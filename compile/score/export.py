"""Export of the scoring node for a deployment's bounds, and its node builder for `python -m compile`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.export import Dim

from compile.attention import KeyPool, pool_mask
from worker.runtime.layout import block_for, padded
from compile.model import Transformer, prefill
from compile.score.heads import MlpHead
from worker.runtime.layout import lay_out
from compile.context import BuildContext
from compile.score.module import ScoreModule
from worker.runtime.score_inputs import OUTPUT_NAMES, PREFIX_KV_OUTPUTS, TOKEN_OUTPUTS, pack_inputs, unused_token_rows
from shared.bounds import Bounds
from shared.config import MlpHeadConfig
from shared.prefix import stable_prefix_ids, template_header



def build(ctx: BuildContext) -> tuple[torch.nn.Module, torch.export.ExportedProgram, dict]:
    """Node builder: the scoring node of ctx's model under ctx.config's bounds (+ the MLP head and
    the keys/values of the static prefix, when the prompt template starts with literal text)."""
    head = load_mlp_head(ctx.config.score.mlp_head, ctx.checkpoint.spec.hidden_size)
    static_ids = static_prefix_ids(ctx.config.score.prompt_template, Path(ctx.config.model.path))
    block = block_for(ctx.device)
    static_kv = static_prefix_kv(ctx.model, static_ids, ctx.device, block) if static_ids else None
    pool = key_pool(ctx.config.build_bounds, len(static_ids), block)
    module = ScoreModule(ctx.model, ctx.config.build_bounds.max_top_k, head, static_kv, pool).to(ctx.device)
    outputs = OUTPUT_NAMES + (("head",) if head is not None else ()) + TOKEN_OUTPUTS + PREFIX_KV_OUTPUTS
    facts = {"outputs": list(outputs), "static_prefix_ids": static_ids, "attention_block": block}
    return module, export_score_node(module, ctx.config.build_bounds, ctx.device, static_ids), facts


def key_pool(bounds: Bounds, static_len: int, block: int) -> KeyPool:
    """The most keys of a call: the static rows, then the prefix-cache hits' and the computed tokens
    (together at most the batch's tokens), each padded to the block (the filler may add a whole
    block, the hits' padding another); the most segments (max_segments)."""
    return KeyPool(block, padded(static_len, block) + (blocks_per_batch(bounds, block) + 2) * block,
                   max_segments(bounds))


def max_segments(bounds: Bounds) -> int:
    """The static prefix and its padding, a hit per group and the hits' padding, a prefix and a
    suffix per sample, the filler."""
    return 3 * bounds.max_samples_per_batch + 4


def blocks_per_batch(bounds: Bounds, block: int) -> int:
    """The most blocks of computed tokens (past the example's 2, or export would specialise)."""
    return max(3, padded(bounds.max_tokens_per_batch + 1, block) // block)


def static_prefix_ids(template: str | None, model_dir: Path) -> list[int]:
    """The tokens of the template's literal header, as the gateway's tokenizer call produces them
    (special tokens included) and independent of what follows; [] when there is none."""
    header = template_header(template)
    if not header:
        return []
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return stable_prefix_ids(lambda text: tokenizer.encode(text, add_special_tokens=True).ids, header)


def static_prefix_kv(model: Transformer, ids: list[int], device: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [layers, C', Hkv, D] of the static prefix, computed once by the model itself;
    C' = len(ids) padded to the block, the padding rows a segment of their own that nobody reads."""
    rows = padded(len(ids), block)
    tokens = torch.tensor(ids + [0] * (rows - len(ids)), dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(len(ids)), torch.arange(rows - len(ids))]).to(device)
    cu = torch.tensor(sorted({0, len(ids), rows}), dtype=torch.int32, device=device)
    mask = pool_mask(KeyPool.fitting(rows, len(cu), block), cu, torch.full((len(cu) - 1,), -1, device=device),
                     rows, rows)
    with torch.no_grad():
        _, keys, values = prefill(model, tokens, positions, mask)
    return torch.stack(keys), torch.stack(values)


def example_inputs(bounds: Bounds, model: Transformer, static_ids: list[int], block: int,
                   device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """A small valid batch used to trace the node: a (block + 4)-token prefix whose first block + 2
    tokens are a prefix-cache hit, shared by suffixes of 2 and block + 3 tokens, its rows kept, so
    that computed tokens, hit rows and kept rows each fill two blocks (a count of 1 would be
    specialised), and 3 token rows for per-token log-probs (2 would look like the unused rows' count)."""
    spec = model.spec
    prefix_len, hit = block + 4, block + 2
    ids = torch.arange(prefix_len + block + 5, dtype=torch.int64) % spec.vocab_size
    layout = lay_out(ids, [2, block + 3], [prefix_len], [2], torch.tensor(static_ids, dtype=torch.int64), block,
                     hits=[hit])
    label_ids = torch.zeros(2, dtype=torch.int64)
    rows = torch.zeros(spec.num_layers, layout.hit_rows, spec.num_kv_heads, spec.head_dim, dtype=model.embed.weight.dtype)
    keep = torch.cat([layout.rows_of_prefix(0), torch.zeros(padded(prefix_len, block) - prefix_len, dtype=torch.int64)])
    token_rows = torch.tensor([0, 1, block + 2], dtype=torch.int64)
    args = (*pack_inputs(ids, None, label_ids, bounds.max_labels, layout), rows, rows.clone(), keep,
            token_rows, ids[token_rows + 1])
    return tuple(t.to(device) for t in args)


def dynamic_shapes(bounds: Bounds, block: int) -> tuple:
    """Tokens, hit rows and kept rows (whole blocks: the layout pads them), segments, samples and token
    rows (at most a batch's tokens: max_token_rows) are dynamic."""
    most = blocks_per_batch(bounds, block)
    tokens = block * Dim("row_blocks", min=1, max=most)
    hit_rows = block * Dim("hit_blocks", min=1, max=most)
    kept_rows = block * Dim("kept_blocks", min=1, max=most)
    segments = Dim("segments", min=2, max=max_segments(bounds))
    samples = Dim("samples", min=2, max=bounds.max_samples_per_batch)
    token_rows = Dim("token_rows", min=len(unused_token_rows()), max=max_token_rows(bounds))
    return ({0: tokens}, {0: tokens}, {0: segments + 1}, {0: segments}, {0: samples}, None, None,
            {1: hit_rows}, {1: hit_rows}, {0: kept_rows}, {0: token_rows}, {0: token_rows})


def max_token_rows(bounds: Bounds) -> int:
    """The most token rows of a call: one per computed token of a batch (worker/runtime/score_inputs.py
    refuses more, naming max_tokens_per_batch)."""
    return bounds.max_tokens_per_batch


def export_score_node(module: ScoreModule, bounds: Bounds, device: str = "cpu",
                      static_ids: list[int] = ()) -> torch.export.ExportedProgram:
    module.pool = module.pool or key_pool(bounds, len(static_ids), block_for(device))
    block = module.pool.block
    args = example_inputs(bounds, module.model, list(static_ids), block, device)
    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes(bounds, block), strict=False)


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
