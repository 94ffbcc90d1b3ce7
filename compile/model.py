"""The project's own packed decoder (Qwen2 / Qwen3 / Llama), written for torch.export.

All samples of a batch are concatenated into one token axis T; linear and MLP layers run on those T
tokens only, and attention runs inside the compiled graph over the batch's segments
(compile/attention.py: each sample causally, or a suffix over its shared prefixes), under a block
mask built once per forward and shared by every layer. T is a multiple of the attention block (the
layouts pad it with a filler segment). Positions are given per token, so every sample starts at
position 0. Shapes: T tokens, H hidden, Hq/Hkv heads, D head dim, B samples.

The building blocks (`Attention.project`, `Attention.output`, `Mlp`, `rope`) are public so that the
beam node can run the same layers against its shared prompt K/V. The passes both nodes share live
here too: `prefill` (the packed prompts once, keeping every layer's keys/values) and
`merge_partials` (two partial softmax attentions over disjoint keys, joined by their log-sum-exp).
"""

from __future__ import annotations

import torch
from torch import nn


from compile.attention import PoolMask, packed_attention
from compile.checkpoint import ModelSpec
from compile.linear import Linear, linear, linear_plus, linear_silu, linear_times


def last_token_index(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """cu_seqlens [B+1] -> index of every sample's last token in the packed axis, [B] int64."""
    return cu_seqlens[1:].long() - 1


def last_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Each sample's last-token query against the keys it may see (no causal mask is needed).

    q [B, Hq, D], k/v [T, Hkv, D], visible [B, T] bool -> [B, Hq, D]. One query per sample, so the
    masked dense form (B x T scores) costs far less than the layer's projections; float32 softmax.
    """
    num_samples, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    grouped = q.view(num_samples, num_kv, num_heads // num_kv, head_dim).float()
    scores = torch.einsum("bkgd,tkd->bkgt", grouped, k.float()) * head_dim**-0.5  # [B, Hkv, G, T]
    weights = scores.masked_fill(~visible[:, None, None, :], float("-inf")).softmax(dim=-1)
    out = torch.einsum("bkgt,tkd->bkgd", weights, v.float())
    return out.reshape(num_samples, num_heads, head_dim).to(q.dtype)


def visible_keys(cu_seqlens: torch.Tensor, parents: torch.Tensor, sample_segments: torch.Tensor,
                 num_rows: int) -> torch.Tensor:
    """[B, num_rows] bool: the key rows a sample's last token sees, i.e. its segment and that
    segment's ancestors (at most two: a request's prefix and the static prefix above it)."""
    rows = torch.arange(num_rows, device=cu_seqlens.device)
    segment_of_row = torch.searchsorted(cu_seqlens[1:], rows, right=True)  # [Tk]
    chain = [sample_segments]
    for _ in range(2):
        up = chain[-1]
        chain.append(torch.where(up >= 0, parents.index_select(0, up.clamp(min=0)), up))
    members = torch.stack(chain, dim=1)  # [B, 3], -1 where the chain ends
    return (segment_of_row[None, :, None] == members[:, None, :]).any(dim=-1)


def with_token_rows(last, visible, token_rows, num_cached: int, cu_seqlens, parents):
    """The last layer's query rows [B] and their visible keys [B, Tk] with the rows token_rows [P]
    (of the computed tokens) appended: [B + P] and [B + P, Tk]. A token row sees the keys of its
    segment's chain (visible_keys) at or before its own pool row; ancestors come first in the pool."""
    pool_rows = token_rows + num_cached  # [P]
    segments = torch.searchsorted(cu_seqlens[1:], pool_rows.to(cu_seqlens.dtype), right=True)  # [P]
    keys = torch.arange(visible.shape[1], device=visible.device)
    causal = keys[None, :] <= pool_rows[:, None]  # [P, Tk]
    token_visible = visible_keys(cu_seqlens, parents, segments, visible.shape[1]) & causal
    return torch.cat([last, token_rows]), torch.cat([visible, token_visible])


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Combine two partial softmax attentions over disjoint key sets: [..., D] outputs, [...] lse.
    Softmax over a concatenation splits exactly into its parts:
    out = out_a · exp(lse_a − lse) + out_b · exp(lse_b − lse), lse = logaddexp(lse_a, lse_b)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]


class RMSNorm(nn.Module):
    """RMS normalisation in float32, scaled in the model dtype (as the HF families do)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_table(spec: ModelSpec) -> torch.Tensor:
    """[P, D] float32: the cosines, then the sines, of every position the model takes (P =
    max_position_embeddings) at its D/2 frequencies, as the family computes them (float32).

    Built once with the weights, so a compiled node gathers rows rather than evaluating sines: a table
    computed from the positions inside the graph is a pointwise expression that Inductor inlines into
    every layer's RoPE kernel, recomputing a sine and a cosine per query and key element of every layer
    (Qwen3-0.6B in bf16 on 2 cores, 4,285 tokens: its q/k norm and RoPE kernel took 11 ms a layer so,
    4.5 ms gathering from this table).
    """
    positions = torch.arange(spec.max_position_embeddings, dtype=torch.int64).float()
    freqs = positions[:, None] * spec.rope.inv_freq(spec.head_dim)[None, :]  # [P, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def rope_rows(table: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D/2] in the model dtype for integer positions [T] (rope_table's rows)."""
    return table.index_select(0, positions).to(dtype).chunk(2, dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by cos/sin [T, D/2] (rotate-half convention: element i pairs with i + D/2).

    The same products and sums as x * (cos, cos) + (-x2, x1) * (sin, sin), written per half so that no
    rotated copy of x is built (compiled on 2 cores, Qwen3-0.6B's q/k norm and RoPE of 4,288 tokens:
    4.3 ms a layer, against 5.3 with the halves swapped by an index flip and 6.8 with the rotated copy).
    """
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with fused q/k/v projection, optional q/k RMSNorm (Qwen3)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv = Linear(spec.hidden_size, q_dim + 2 * kv_dim, bias=spec.qkv_bias)
        self.o = Linear(q_dim, spec.hidden_size, bias=spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [T, H] -> q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], with norms and RoPE applied."""
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        return self._finish_q(q, cos, sin), *self._finish_kv(k, v, cos, sin)

    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Queries only, for rows that need no keys of their own: x [N, H] -> [N, Hq, D]."""
        q_dim = self.split[0]
        bias = None if self.qkv.bias is None else self.qkv.bias[:q_dim]
        return self._finish_q(linear(x, self.qkv.weight[:q_dim], bias, self.qkv.gemm), cos, sin)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys and values only: x [T, H] -> k, v [T, Hkv, D]."""
        q_dim = self.split[0]
        bias = None if self.qkv.bias is None else self.qkv.bias[q_dim:]
        k, v = linear(x, self.qkv.weight[q_dim:], bias, self.qkv.gemm).split(self.split[1:], dim=-1)
        return self._finish_kv(k, v, cos, sin)

    def _finish_q(self, q, cos, sin):
        q = q.view(-1, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return rope(q, cos, sin).contiguous()

    def _finish_kv(self, k, v, cos, sin):
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return rope(k, cos, sin).contiguous(), v.reshape(-1, self.num_kv_heads, self.head_dim).contiguous()

    def output(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual [T, H] + the projection of attn [T, Hq, D], the add being the GEMM's epilogue on oneDNN."""
        return linear_plus(self.o, attn.reshape(attn.shape[0], -1), residual)


class Mlp(nn.Module):
    """SwiGLU MLP: gate and up are two weights, so that on oneDNN the SiLU is the gate GEMM's epilogue and the
    product with it the up GEMM's (compile/linear.py: epilogues)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate = Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up = Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down = Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H]."""
        return self.down(self.swiglu(x))

    def residual(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + forward(x), the add being the down GEMM's epilogue on oneDNN."""
        return linear_plus(self.down, self.swiglu(x), residual)

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """silu(x Wg^T) * (x Wu^T) [N, I]."""
        return linear_times(self.up, x, linear_silu(self.gate, x))


class Layer(nn.Module):
    """One pre-norm decoder layer."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.attn = Attention(spec)
        self.post_attn_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = Mlp(spec)

    def forward(self, x, cos, sin, mask: PoolMask, cached_kv=None):
        """x [T, H] -> [T, H]: attention over the key pool (cached_kv's rows, then x's own) under `mask`."""
        return self.forward_kv(x, cos, sin, mask, cached_kv)[0]

    def forward_kv(self, x, cos, sin, mask: PoolMask, cached_kv=None):
        """The layer's output [T, H] and the keys and values [T, Hkv, D] of x's own tokens.
        cached_kv: keys and values [C, Hkv, D] of C cached rows placed before the batch's own."""
        q, k, v = self.attn.project(self.input_norm(x), cos, sin)
        pool_k, pool_v = _with_cached(k, v, cached_kv)  # [C + T, Hkv, D]
        x = self.attn.output(packed_attention(q, pool_k, pool_v, mask), x)
        return self.mlp.residual(self.post_attn_norm(x), x), k, v

    def forward_last(self, x, cos, sin, last, visible, cached_kv=None):
        """The layer's output at the rows `last` [B] only: x [T, H] -> [B, H].

        Keys and values are still computed for every token, but queries, the output projection
        and the MLP run on B rows instead of T: the last layer of a scoring pass needs no more.
        visible [B, C + T]: the keys each of those rows attends to (cached rows first).
        """
        return self.forward_last_kv(x, cos, sin, last, visible, cached_kv)[0]

    def forward_last_kv(self, x, cos, sin, last, visible, cached_kv=None):
        """forward_last's output [B, H] and the keys and values [T, Hkv, D] of x's own tokens."""
        h = self.input_norm(x)
        own_k, own_v = self.attn.project_kv(h, cos, sin)
        k, v = _with_cached(own_k, own_v, cached_kv)
        q = self.attn.project_q(h.index_select(0, last), cos.index_select(0, last), sin.index_select(0, last))
        y = self.attn.output(last_query_attention(q, k, v, visible), x.index_select(0, last))
        return self.mlp.residual(self.post_attn_norm(y), y), own_k, own_v


def _with_cached(k, v, cached_kv):
    if cached_kv is None:
        return k, v
    return torch.cat([cached_kv[0], k]), torch.cat([cached_kv[1], v])


def pool_rows(k, v, cached_kv, rows):
    """Rows `rows` [R] of the key pool (cached_kv's C rows, then k/v's own [T, Hkv, D]) -> [R, Hkv, D]
    keys and values, gathered from each part without building the pool again."""
    if cached_kv is None:
        return k.index_select(0, rows), v.index_select(0, rows)
    count = cached_kv[0].shape[0]
    from_cache = (rows < count)[:, None, None]
    cache_rows, own_rows = rows.clamp(max=count - 1), (rows - count).clamp(min=0)
    return (torch.where(from_cache, cached_kv[0].index_select(0, cache_rows), k.index_select(0, own_rows)),
            torch.where(from_cache, cached_kv[1].index_select(0, cache_rows), v.index_select(0, own_rows)))


class Transformer(nn.Module):
    """Packed decoder: token ids [T] -> hidden states [T, H] before the final norm."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.gemm = "aten"  # the kernel of the output projection (compile/linear.py: use_gemm)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        if not spec.tie_word_embeddings:
            self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.register_buffer("rope_table", rope_table(spec), persistent=True)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V, H]: the output projection (the embedding when tied)."""
        return self.embed.weight if self.spec.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: PoolMask) -> torch.Tensor:
        x = self.embed(input_ids)  # [T, H]
        cos, sin = rope_rows(self.rope_table, positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x

    def last_hidden(self, input_ids, positions, mask: PoolMask, cu_seqlens, parents=None, sample_segments=None,
                    static_kv=None, keep_rows=None, token_rows=None):
        """Hidden state [B, H] (before the final norm) at every sample's last token only.

        Without `parents` every sample is its own segment (cu_seqlens [B+1] over input_ids). With
        them, cu_seqlens [S+1] spans the key pool (static_kv's C rows, then input_ids' T tokens),
        parents [S] says which segment each extends (-1: none), sample_segments [B] which segment
        ends each sample. static_kv = (keys, values) [layers, C, Hkv, D]: cached, never recomputed.
        `mask` is the pool's mask (compile/attention.pool_mask of the same segments).
        keep_rows [R] (pool rows): also return every layer's keys and values at those rows,
        [layers, R, Hkv, D] each (a prefix's, for the worker's prefix cache).
        token_rows [P] (rows of input_ids): the hidden states at those rows too, after the B last ones
        ([B + P, H]), each row seeing its own segment's keys up to itself and its ancestors' (per-token
        log-probs); the last layer computes B + P rows instead of B.
        """
        if parents is None:
            parents = torch.full_like(cu_seqlens[1:], -1, dtype=torch.int64)
            sample_segments = torch.arange(cu_seqlens.shape[0] - 1, device=cu_seqlens.device)
        x = self.embed(input_ids)  # [T, H]
        cos, sin = rope_rows(self.rope_table, positions, x.dtype)
        cached = [None] * len(self.layers) if static_kv is None else list(zip(*static_kv))
        kept = []
        for layer, kv in zip(self.layers[:-1], cached):
            if keep_rows is None:
                x = layer(x, cos, sin, mask, kv)
            else:
                x, k, v = layer.forward_kv(x, cos, sin, mask, kv)
                kept.append(pool_rows(k, v, kv, keep_rows))
        num_cached = 0 if static_kv is None else static_kv[0].shape[1]  # rows before the batch's own
        last = cu_seqlens.index_select(0, sample_segments + 1).long() - 1 - num_cached  # [B]
        visible = visible_keys(cu_seqlens, parents, sample_segments, num_cached + input_ids.shape[0])
        if token_rows is not None:
            last, visible = with_token_rows(last, visible, token_rows, num_cached, cu_seqlens, parents)
        if keep_rows is None:
            return self.layers[-1].forward_last(x, cos, sin, last, visible, cached[-1])
        out, k, v = self.layers[-1].forward_last_kv(x, cos, sin, last, visible, cached[-1])
        kept.append(pool_rows(k, v, cached[-1], keep_rows))
        return out, torch.stack([k for k, _ in kept]), torch.stack([v for _, v in kept])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and full-vocabulary projection of selected rows: [N, H] -> [N, V] float32."""
        return linear(self.norm(hidden), self.lm_head_weight, None, self.gemm).float()


def prefill(model: Transformer, ids, positions, mask: PoolMask):
    """ids, positions [T] -> hidden [T, H] (before the final norm), and every layer's keys and
    values: per layer [T, Hkv, D]. `mask`: the prompts' mask (each prompt causally)."""
    x = model.embed(ids)  # [T, H]
    cos, sin = rope_rows(model.rope_table, positions, x.dtype)
    keys, values = [], []
    for layer in model.layers:
        x, k, v = layer.forward_kv(x, cos, sin, mask)
        keys.append(k)
        values.append(v)
    return x, keys, values


def build_model(spec: ModelSpec, state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> Transformer:
    """A Transformer in eval mode holding the given weights (our layout, see checkpoint.convert_weights)."""
    with torch.device("meta"):
        model = Transformer(spec)
    state = dict(state_dict)
    state["rope_table"] = rope_table(spec)
    model.load_state_dict(state, strict=True, assign=True)
    for name, param in model.named_parameters():
        if param.dtype != dtype:
            raise ValueError(f"weight {name} is {param.dtype}, expected {dtype}")
    return model.eval().requires_grad_(False)
