"""ScoreNode: the worker-side face of the compiled scoring package.

Checks a batch against the compiled bounds (shared/bounds.py's rules; BoundsError before anything
runs), lays it out as segments (worker/runtime/layout.py: shared prefixes computed once, the static
prefix reused, prefix-cache hits read as cached rows) and cuts the package's padded outputs down to
the batch's samples, labels and k, and to the kept prefixes' keys/values. Groups asked for per-token
log-probs (`token_groups`) are computed whole (no static prefix or hit reused) and get, for every
position of every sample but the last, the log-prob of the next token and the top max_top_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from worker.runtime.layout import padded
from worker.runtime.machine import check_threads
from worker.runtime.layout import Layout, lay_out
from worker.runtime.score_inputs import (OUTPUT_NAMES, PREFIX_KV_OUTPUTS, TOKEN_OUTPUTS, pack_hits, pack_inputs,
                                         token_rows, unused_token_rows)
from worker.runtime.transfer import Pending, Staging
from shared.bounds import BoundsError, outside_vocabulary, score_problem
from shared.manifest import Manifest
from shared.work import WorkSize, batch_shape


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
    cached_tokens: torch.Tensor  # [R] int64 per group: tokens whose keys/values were reused, not computed
    prefix_kv: dict[int, tuple[torch.Tensor, torch.Tensor]]  # group -> its prefix's keys, values [layers, P, Hkv, D] (kept groups)
    token_logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)  # group -> its per-token log-probs (token_groups)


@dataclass(frozen=True)
class TokenLogprobs:
    """A group's per-token prompt log-probs: one row per position 0 .. L-2 of each of its samples, in
    sample order (P rows), predicting the sample's next token."""

    logprobs: torch.Tensor  # [P] float32, the next token's log-prob under the full vocabulary
    topk_ids: torch.Tensor  # [P, K] int64, K = the compiled max_top_k
    topk_logprobs: torch.Tensor  # [P, K] float32


class ScoreNode:
    """Runs the compiled scoring package on a batch of groups (a shared prefix + its samples' suffixes)."""

    def __init__(self, package: Any, manifest: Manifest, device: str):
        self.package = package
        self.bounds = manifest.bounds
        self.vocab_size = manifest.model.vocab_size
        facts = manifest.node_table().score
        self.has_head = "head" in facts.outputs
        self.takes_hits = PREFIX_KV_OUTPUTS[0] in facts.outputs  # packages built before the prefix cache do not
        self.takes_tokens = TOKEN_OUTPUTS[0] in facts.outputs  # nor those built before per-token log-probs
        self.sample_outputs = len(OUTPUT_NAMES) + self.has_head  # outputs with a row per sample, first
        model = manifest.model
        self.kv_shape = (model.num_layers, model.num_kv_heads, model.head_dim)  # of a prefix cache row
        self.static_prefix_ids = facts.static_prefix_ids
        self.block = facts.attention_block  # the layout pads the token axis to it
        # a miss's inputs, made once: one block of zero hit rows nobody reads, one block of kept row 0
        self._zero_hits = tuple(torch.zeros(model.num_layers, self.block, model.num_kv_heads, model.head_dim,
                                            dtype=getattr(torch, manifest.dtype)) for _ in range(2))
        self._zero_keep = torch.zeros(self.block, dtype=torch.int64)
        self._static = torch.tensor(self.static_prefix_ids, dtype=torch.int64)
        self.device = torch.device(device)
        self.threads = manifest.cpu_threads if self.device.type == "cpu" else None  # compiled for

    def __call__(self, input_ids: torch.Tensor, sample_lens: torch.Tensor, label_ids: torch.Tensor, top_k: int,
                 prefix_lens: torch.Tensor | None = None, group_sizes: torch.Tensor | None = None,
                 hits: list | None = None, keep: list[int] = (), token_groups: list[int] = ()) -> ScoreOutput:
        """Group r's ids are its prefix (prefix_lens[r]) then its group_sizes[r] samples' suffixes
        (sample_lens); without prefix_lens every sample is a group of its own with no prefix.
        hits[r]: None, or the keys/values [layers, P, Hkv, D] of the first P tokens of group r's
        prefix (the worker's prefix cache), read instead of computed. keep: groups whose whole
        prefix's keys/values come back in ScoreOutput.prefix_kv. token_groups: groups whose per-token
        log-probs come back in ScoreOutput.token_logprobs (computed whole: they take no hit)."""
        return self.launch(input_ids, sample_lens, label_ids, top_k, prefix_lens, group_sizes, hits=hits,
                           keep=keep, token_groups=token_groups).result()

    def launch(self, input_ids: torch.Tensor, sample_lens: torch.Tensor, label_ids: torch.Tensor, top_k: int,
               prefix_lens: torch.Tensor | None = None, group_sizes: torch.Tensor | None = None,
               staging: Staging | None = None, hits: list | None = None, keep: list[int] = (),
               token_groups: list[int] = ()) -> Pending:
        """Enqueue the call (on a GPU: on the current stream, through `staging`'s pinned buffers) and
        return at once; Pending.result() waits for the outputs and builds the ScoreOutput."""
        if prefix_lens is None:
            prefix_lens, group_sizes = torch.zeros_like(sample_lens), torch.ones_like(sample_lens)
        self.check(input_ids, sample_lens, label_ids, top_k, prefix_lens, group_sizes)
        check_threads(self.threads, torch.get_num_threads())  # this thread's count, checked per call
        args, layout, counts = self.package_inputs(input_ids, sample_lens, label_ids, prefix_lens, group_sizes, hits,
                                                   keep, token_groups)
        staging = staging or Staging(str(self.device))
        with torch.inference_mode():
            outputs = self.package(*staging.to_device(args))
            kept = sum(int(prefix_lens[g]) for g in keep)
            rows = [t[: layout.num_samples] for t in outputs[: self.sample_outputs]]  # filler dropped
            if self.takes_tokens:
                token_outputs = outputs[self.sample_outputs: self.sample_outputs + len(TOKEN_OUTPUTS)]
                rows += [t[: sum(counts.values())] for t in token_outputs]  # the unused rows dropped
            if keep:
                rows += [t[:, :kept] for t in outputs[-2:]]
            return staging.to_host(rows, lambda host: self._output(host, len(label_ids), top_k, layout.cached_tokens,
                                                                   {g: int(prefix_lens[g]) for g in keep}, counts))

    def package_inputs(self, input_ids, sample_lens, label_ids, prefix_lens, group_sizes, hits: list | None = None,
                       keep: list[int] = (), token_groups: list[int] = ()
                       ) -> tuple[tuple[torch.Tensor, ...], Layout, dict[int, int]]:
        """The package's inputs for a checked batch (host tensors), the layout they come from and the
        token groups' counts of token rows."""
        hits = hits or [None] * len(prefix_lens)
        if not self.takes_hits and (any(h is not None for h in hits) or keep):
            raise ValueError("this scoring package was built before the prefix cache: rebuild it to read or keep prefix rows")
        if token_groups and not self.takes_tokens:
            raise ValueError("this scoring package was built before per-token log-probs: rebuild it to return them")
        lens, prefixes, sizes = sample_lens.tolist(), prefix_lens.tolist(), group_sizes.tolist()
        layout = lay_out(input_ids.long(), lens, prefixes, sizes, self._static, self.block,
                         hits=[0 if h is None else h[0].shape[1] for h in hits],
                         min_hit_rows=self.block if self.takes_hits else 0, computed_groups=frozenset(token_groups))
        args = pack_inputs(input_ids, sample_lens, label_ids, self.bounds.max_labels, layout)
        if self.takes_hits:
            args = (*args, *self._hit_rows(hits, layout.hit_rows), self._keep_rows(layout, keep))
        counts = {}
        if self.takes_tokens:
            first_computed = padded(len(self.static_prefix_ids), self.block) + layout.hit_rows
            rows, targets, per_group = (token_rows(layout, input_ids, lens, prefixes, sizes, sorted(token_groups),
                                                   first_computed) if token_groups else (*unused_token_rows(), []))
            _check(sum(per_group) <= self.bounds.max_tokens_per_batch,
                   f"per-token log-probs of {sum(per_group)} positions, more than max_tokens_per_batch "
                   f"({self.bounds.max_tokens_per_batch}) in one batch")
            counts = dict(zip(sorted(token_groups), per_group))
            args = (*args, rows, targets)
        return args, layout, counts

    def _hit_rows(self, hits: list, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The hits' keys/values as the package's hit_k, hit_v [layers, rows, Hkv, D] (zeros past them)."""
        held = [h for h in hits if h is not None]
        if not held:
            return self._zero_hits  # layout.hit_rows is one block: read by nobody
        for keys, values in held:
            if keys.shape != values.shape or (keys.shape[0], *keys.shape[2:]) != self.kv_shape:
                raise ValueError(f"hit keys {tuple(keys.shape)} / values {tuple(values.shape)} are not "
                                 f"[{self.kv_shape[0]}, P, {self.kv_shape[1]}, {self.kv_shape[2]}]")
        return pack_hits(held, rows)

    def _keep_rows(self, layout, keep: list[int]) -> torch.Tensor:
        """The kept groups' prefix rows in the key pool, padded with row 0 to a whole block (at least one)."""
        if not keep:
            return self._zero_keep
        rows = torch.cat([layout.rows_of_prefix(g) for g in keep])
        size = max(self.block, padded(len(rows), self.block))
        return torch.cat([rows, torch.zeros(size - len(rows), dtype=torch.int64)])

    def _output(self, outputs: list[torch.Tensor], num_labels: int, top_k: int, cached: list[int],
                kept: dict[int, int], token_counts: dict[int, int]) -> ScoreOutput:
        n, k = num_labels, top_k
        tokens, start = {}, 0
        for group, count in token_counts.items():  # in group order, as token_rows laid them out
            part = slice(start, start + count)
            tokens[group] = TokenLogprobs(*(t[part] for t in outputs[self.sample_outputs: self.sample_outputs + 3]))
            start += count
        prefix_kv, start = {}, 0
        for group, length in kept.items():  # the kept prefixes' rows, in the order they were asked for
            prefix_kv[group] = (outputs[-2][:, start: start + length], outputs[-1][:, start: start + length])
            start += length
        return ScoreOutput(
            label_logits=outputs[0][:, :n], label_logprobs=outputs[1][:, :n], label_probs=outputs[2][:, :n],
            topk_ids=outputs[3][:, :k], topk_logprobs=outputs[4][:, :k], hidden=outputs[5],
            head=outputs[6] if self.has_head else None,
            cached_tokens=torch.tensor(cached, dtype=torch.int64),
            prefix_kv=prefix_kv,
            token_logprobs=tokens,
        )

    def check(self, input_ids, sample_lens, label_ids, top_k, prefix_lens, group_sizes) -> None:
        """Raise BoundsError naming the first bound (shared/bounds.py) or consistency rule the batch breaks."""
        for name, t in (("input_ids", input_ids), ("sample_lens", sample_lens), ("label_ids", label_ids),
                        ("prefix_lens", prefix_lens), ("group_sizes", group_sizes)):
            _check(t.dim() == 1, f"{name} must be a 1-D tensor")
        _check(len(sample_lens) >= 1, "a batch needs at least one sample")
        _check(len(prefix_lens) == len(group_sizes) and int(group_sizes.min()) >= 1
               and int(group_sizes.sum()) == len(sample_lens),
               "group_sizes must hold one size >= 1 per prefix and add up to the number of samples")
        _check(int(prefix_lens.min()) >= 0 and int(sample_lens.min()) >= 0 and top_k >= 0,
               "lengths and top_k must not be negative")
        works = WorkSize.groups(prefix_lens.tolist(), sample_lens.tolist(), group_sizes.tolist())
        _check(min(w.shortest_sample for w in works) >= 1, "every sample needs at least one token")
        given = sum(w.sent_tokens for w in works)
        _check(given == len(input_ids), f"prefix and sample lengths add up to {given} but {len(input_ids)} token ids were given")
        problem = score_problem(self.bounds, batch_shape(works, len(label_ids), top_k))
        _check(problem is None, str(problem))
        for noun, ids in (("token id", input_ids), ("label token id", label_ids)):
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
                raise BoundsError(outside_vocabulary(noun, self.vocab_size))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BoundsError(message)
