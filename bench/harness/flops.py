"""FLOPs our nodes actually execute, and the MFU they give against a peak measured in the same run.

Counted as the project defines MFU: valid (unpadded) tokens only; every layer counted for the rows
it really runs; attention as 4 · heads · head_dim · L² / 2 per causal sample of L tokens (Q·Kᵀ and
P·V, two FLOPs per multiply-add, half the square for the causal mask); the vocabulary projection
only for the rows that are projected. Softmax, norms, RoPE and top-k are not counted (they are
not matrix work, and leaving them out can only lower the figure).

Shapes come from compile.checkpoint.ModelSpec: H hidden, I intermediate, Hq/Hkv heads, D head dim,
V vocabulary.
"""

from __future__ import annotations


class MfuAboveOne(RuntimeError):
    """A measured MFU above 1: the peak measurement was disturbed, or the FLOP count is wrong."""


def _q_o_mlp(spec) -> int:
    """FLOPs per row of the query and output projections and the MLP."""
    q = spec.num_heads * spec.head_dim
    return 2 * spec.hidden_size * q + 2 * q * spec.hidden_size + 2 * 3 * spec.hidden_size * spec.intermediate_size


def _kv(spec) -> int:
    """FLOPs per row of the key and value projections."""
    return 2 * spec.hidden_size * 2 * spec.num_kv_heads * spec.head_dim


def _attention(spec, query_rows_times_keys: float) -> float:
    """Q·Kᵀ and P·V for that many (query, key) pairs, per layer."""
    return 4 * spec.num_heads * spec.head_dim * query_rows_times_keys


def _head(spec, rows: int) -> int:
    return 2 * rows * spec.hidden_size * spec.vocab_size


def full_layers(spec, lengths: list[int], num_layers: int) -> float:
    """num_layers complete causal layers over packed samples of these lengths."""
    tokens = sum(lengths)
    causal_pairs = sum(n * n for n in lengths) / 2
    return num_layers * ((_q_o_mlp(spec) + _kv(spec)) * tokens + _attention(spec, causal_pairs))


def score_flops(spec, lengths: list[int]) -> float:
    """One scoring pass (compile/model.py last_hidden + logits): every layer but the last in full;
    the last computes keys/values for every token, but queries, output projection and MLP for
    each sample's last token only, whose one query attends to its sample's L keys; then the
    head for B rows."""
    samples = len(lengths)
    last_layer = _kv(spec) * sum(lengths) + _q_o_mlp(spec) * samples + _attention(spec, sum(lengths))
    return full_layers(spec, lengths, spec.num_layers - 1) + last_layer + _head(spec, samples)


def beam_flops(spec, prompt_lens: list[int], num_beams: int, num_steps: int) -> float:
    """One beam call (compile/beam/module.py): a full prefill of the prompts, the head at each
    prompt's last token, then num_steps - 1 decode steps of R·W rows, each query attending to its
    prompt's L keys plus the j suffix keys of its own beam (j = 1, 2, ...), and the head for
    every row."""
    requests = len(prompt_lens)
    total = full_layers(spec, prompt_lens, spec.num_layers) + _head(spec, requests)
    rows = requests * num_beams
    for j in range(1, num_steps):
        pairs = num_beams * sum(n + j for n in prompt_lens)
        total += spec.num_layers * ((_q_o_mlp(spec) + _kv(spec)) * rows + _attention(spec, pairs))
        total += _head(spec, rows)
    return total


def executed_mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """flops / seconds / peak, refusing a figure above 1 (no machine runs faster than its peak)."""
    mfu = flops / seconds / peak_flops
    if mfu > 1.0:
        raise MfuAboveOne(
            f"executed MFU {mfu:.3f} > 1 ({flops / seconds / 1e9:.1f} GFLOP/s against a peak of "
            f"{peak_flops / 1e9:.1f}): the peak was measured while the machine was busy; rerun on a quiet machine")
    return mfu


def shared_score_flops(spec, prefix_len: int, suffix_lens: list[int], static_len: int = 0) -> float:
    """One scoring pass of a request laid out as a shared prefix computed once plus one suffix per
    sample (worker/runtime/layout.py), over `static_len` cached static-prefix rows (not computed).
    Every layer but the last runs the prefix's and the suffixes' tokens; the prefix attends causally
    to itself and to the static rows, each suffix token to the static and prefix keys in full and to
    its own causally. The last layer: keys/values for every computed token, queries, output
    projection and MLP for the samples' last tokens (each attending to its whole sample), then the head."""
    own = prefix_len - static_len
    tokens = own + sum(suffix_lens)
    pairs = own * own / 2 + own * static_len + sum(n * n / 2 + n * prefix_len for n in suffix_lens)
    layers = (spec.num_layers - 1) * ((_q_o_mlp(spec) + _kv(spec)) * tokens + _attention(spec, pairs))
    samples = len(suffix_lens)
    last_keys = sum(prefix_len + n for n in suffix_lens)
    last_layer = _kv(spec) * tokens + _q_o_mlp(spec) * samples + _attention(spec, last_keys)
    return layers + last_layer + _head(spec, samples)
