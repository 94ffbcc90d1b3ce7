"""CTranslate2, the peer engine: the same checkpoint converted once, scored and beam-searched through its API.

Scoring is prefill plus one head row: generate_batch(max_length=1, include_prompt_in_result=False,
return_scores=True) gives each sample's greedy next token and its log-probability, which we compare
with our top-1 (return_logits_vocab would project every prompt position: not the fair call).
Beam search is its own (beam_size=W, num_hypotheses=k). It takes token strings: inputs are turned
into strings before any timing, as our node gets its tensors ready-made.

CTranslate2 offers float32, int8, int8_float32, int8_bfloat16, int16 and bfloat16 compute types on a CPU
(those this build and CPU support: get_supported_compute_types); a run below float32 sweeps every one offered
and takes the fastest that passes parity (bench/score_node.py). `max_batch_size` makes it sort the batch by
length and run chunks of that many examples.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bench.harness.common import CACHE

CPU_COMPUTE_TYPES = ("int8_float32", "int8", "int8_bfloat16", "int16", "bfloat16", "float32")
"""Every CPU compute type CTranslate2 has, in the order swept (the first sets the batch size)."""
SCORE_ROWS = 2
"""Rows per score_batch call in label_logprobs (its memory: see there)."""


def require_ctranslate2():
    try:
        import ctranslate2
    except ImportError as exc:
        raise SystemExit("ctranslate2 is not installed: `make bench` installs the bench extra "
                         "(.venv/bin/pip install -e '.[bench]'), or pass --no-ct2") from exc
    return ctranslate2


def sweep_types(offered: set[str] | frozenset[str], below_float32: bool) -> tuple[str, ...]:
    """The compute types a run sweeps: float32 alone for a float32 run; else every type of CPU_COMPUTE_TYPES that
    CTranslate2 offers on this machine (`offered`), float32 included (it checks the converted model strictly)."""
    if not below_float32:
        return ("float32",)
    return tuple(t for t in CPU_COMPUTE_TYPES if t in offered)


class Ct2Model:
    """A checkpoint converted to CTranslate2 (cached beside it), with one Generator per compute type."""

    def __init__(self, checkpoint: Path, threads: int):
        self.ct2 = require_ctranslate2()
        self.folder = CACHE / "ct2" / f"{checkpoint.name}-ct2-{self.ct2.__version__}"
        if not (self.folder / "model.bin").is_file():
            self.ct2.converters.TransformersConverter(str(checkpoint)).convert(str(self.folder), force=True)
            self._set_bos()
        self.vocabulary = json.loads((self.folder / "vocabulary.json").read_text())
        self.threads = threads
        self.generators: dict[str, object] = {}
        self.offered = frozenset(self.ct2.get_supported_compute_types("cpu"))

    def _set_bos(self) -> None:
        """Llama configs without a BOS token convert to a null bos_token, which the loader refuses;
        scoring and beams never insert one, so any vocabulary string will do."""
        path = self.folder / "config.json"
        config = json.loads(path.read_text())
        if config.get("bos_token") is None:
            config["bos_token"] = config["eos_token"]
            path.write_text(json.dumps(config, indent=2))

    def generator(self, compute_type: str):
        if compute_type not in self.generators:
            self.generators[compute_type] = self.ct2.Generator(
                str(self.folder), device="cpu", compute_type=compute_type, intra_threads=self.threads, inter_threads=1)
        return self.generators[compute_type]

    def strings(self, rows: list[torch.Tensor]) -> list[list[str]]:
        """Token ids -> CTranslate2's token strings (done once, before timing)."""
        return [[self.vocabulary[i] for i in row.tolist()] for row in rows]

    def score(self, compute_type: str, rows: list[list[str]], max_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's greedy next token [B] int64 and its full-vocabulary log-probability [B] float32."""
        results = self.generator(compute_type).generate_batch(
            rows, max_length=1, include_prompt_in_result=False, return_scores=True, max_batch_size=max_batch_size)
        ids = torch.tensor([r.sequences_ids[0][0] for r in results])
        return ids, torch.tensor([r.scores[0] for r in results], dtype=torch.float32)

    def last_logits(self, compute_type: str, rows: list[list[str]], static_prompt: list[str] | None = None) -> torch.Tensor:
        """Each row's next-token scores over the vocabulary [B, V] float32, rows in their order: generate_batch(
        max_length=1, return_logits_vocab=True) one row per batch (rows of unequal length in one batch are
        stepped token by token past the shortest, each step projected to the vocabulary: 12 rerank prompts of
        64-256 tokens took 5.0 s one per batch, 53 s four per batch, 2 layers). With `static_prompt` every row
        continues that prompt, whose state CTranslate2 computes once and keeps (cache_static_prompt): its
        shared-prefix path (12 rows after a 64-token prompt: 3.2 s against 5.0 s as full prompts). Log-softmax
        leaves the difference of two entries as it is, which is what a relevance needs."""
        results = self.generator(compute_type).generate_batch(
            rows, max_length=1, include_prompt_in_result=False, return_logits_vocab=True, max_batch_size=1,
            static_prompt=static_prompt, cache_static_prompt=static_prompt is not None)
        return torch.stack([torch.as_tensor(np.asarray(r.logits[0][-1]), dtype=torch.float32) for r in results])

    def label_logprobs(self, compute_type: str, rows: list[list[str]], label_ids: list[int]) -> torch.Tensor:
        """log P(label | sample) [B, labels] float32: score_batch on sample + label, the last token's log-prob.
        Two rows per call (SCORE_ROWS): score_batch computes the whole vocabulary at every position, and all 30
        rows of a request at once (15 samples x 2 labels, up to 481 tokens, 151,936 logits each) would be
        ~8.8 GB of float32 logits alone (a 24-layer int8 run peaked at 18.4 GB in the phase that calls this;
        the next was killed for memory at about that point). The two rows of one sample have the same length,
        so no row is padded: in int8 padding changes CTranslate2's results
        (5 short samples scored all at once against one by one: up to 0.38 nats apart in int8, 6e-5 in float32;
        one by one and in pairs: identical), so its int8 is measured at its most accurate."""
        labels = [self.vocabulary[i] for i in label_ids]
        scored = self.generator(compute_type).score_batch([row + [label] for row in rows for label in labels],
                                                          max_batch_size=SCORE_ROWS)
        values = torch.tensor([s.log_probs[-1] for s in scored], dtype=torch.float32)
        return values.view(len(rows), len(labels))

    def beams(self, compute_type: str, rows: list[list[str]], num_beams: int, steps: int, k: int,
              max_batch_size: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Its beam search -> tokens [R, k, S] (pad after an end), scores [R, k] (log-prob / length)."""
        results = self.generator(compute_type).generate_batch(
            rows, beam_size=num_beams, num_hypotheses=k, max_length=steps, include_prompt_in_result=False,
            return_scores=True, max_batch_size=max_batch_size, length_penalty=1.0)
        tokens = torch.full((len(rows), k, steps), pad_id, dtype=torch.int64)
        for r, result in enumerate(results):
            for j, seq in enumerate(result.sequences_ids):
                tokens[r, j, :len(seq)] = torch.tensor(seq, dtype=torch.int64)
        return tokens, torch.tensor([r.scores for r in results], dtype=torch.float32)
