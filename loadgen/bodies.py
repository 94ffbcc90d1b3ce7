"""Request bodies from trace records, with inputs of exactly the recorded token lengths.

Two ways to hit a token length exactly:
  ids   (default, the most exact) each sample / prompt is sent as {"input_ids": [...]} holding
        exactly that many ids, so no tokenizer can change the count. Ids are drawn (seeded) from
        the tokenizer's ordinary vocabulary when a tokenizer.json is given (special and added tokens
        excluded), else uniformly from [id_low, id_high).
  text  needs the served tokenizer.json: text is built from words that are single tokens of that
        tokenizer, then encoded to check that it is exactly the wanted length (no special tokens
        added); a length that cannot be hit exactly is an error, never an approximation.
A prompt template configured in the gateway ([score].prompt_template) adds its own tokens on top.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from loadgen.trace import TraceRecord


@dataclass(frozen=True)
class BodyOptions:
    """Fields synthesised bodies carry besides their inputs."""

    mode: str = "ids"
    """ids | text"""
    tokenizer_path: str | None = None
    id_low: int = 10
    id_high: int = 1000
    label_token_ids: tuple[int, ...] = (10, 11)
    output: str = "logprobs"
    top_k: int | None = None
    beam_width: int = 16
    max_new_tokens: int = 4
    num_return_sequences: int = 1
    deadline_ms: float | None = None
    """Deadline for records without their own; None leaves the gateway's route default."""
    seed: int = 0


class BodyFactory:
    """Builds the JSON body of each record; deterministic for the same options and record index."""

    def __init__(self, options: BodyOptions = BodyOptions()) -> None:
        if options.mode not in ("ids", "text"):
            raise ValueError(f"body mode must be ids or text, got {options.mode!r}")
        if options.mode == "text" and not options.tokenizer_path:
            raise ValueError("text bodies need --tokenizer path/to/tokenizer.json")
        self.options = options
        self.tokenizer = _load_tokenizer(options.tokenizer_path) if options.tokenizer_path else None
        self.vocab_ids = _ordinary_ids(self.tokenizer) if self.tokenizer else None
        self.text = TextSynthesizer(self.tokenizer) if options.mode == "text" else None

    def body(self, record: TraceRecord, index: int) -> dict[str, Any]:
        if record.body is not None:
            body = dict(record.body)
        elif record.route == "score":
            body = self._score_body(record, index)
        else:
            body = self._generate_body(record, index)
        deadline = record.deadline_ms if record.deadline_ms is not None else self.options.deadline_ms
        if deadline is not None and "deadline_ms" not in body:
            body["deadline_ms"] = int(round(deadline))
        if record.priority and "priority" not in body:
            body["priority"] = record.priority
        return body

    def input_of(self, length: int, rng: random.Random) -> Any:
        """One sample or prompt of exactly `length` tokens, in the chosen mode."""
        if self.text is not None:
            return self.text.text_of(length, rng)
        if self.vocab_ids:
            return {"input_ids": [rng.choice(self.vocab_ids) for _ in range(length)]}
        return {"input_ids": [rng.randrange(self.options.id_low, self.options.id_high) for _ in range(length)]}

    def _score_body(self, record: TraceRecord, index: int) -> dict[str, Any]:
        rng = random.Random(self.options.seed * 1_000_003 + index)
        body: dict[str, Any] = {
            "samples": self._samples(record.sample_tokens, record.prefix_tokens, rng, record.context),
            "label_token_ids": list(self.options.label_token_ids),
            "output": self.options.output,
        }
        if self.options.top_k:
            body["top_k"] = self.options.top_k
        return body

    def _samples(self, lengths: tuple[int, ...], prefix_tokens: int, rng: random.Random,
                 context: int | None = None) -> list[Any]:
        """Samples of these lengths whose first `prefix_tokens` tokens are the same (exactly so with
        token ids; with text, the same words, which a tokenizer may merge at the seam); the prefix is
        the same for every record of one `context`."""
        if not prefix_tokens:
            return [self.input_of(n, rng) for n in lengths]
        context_rng = rng if context is None else random.Random(f"{self.options.seed}/context/{context}")
        prefix = self.input_of(prefix_tokens, context_rng)
        rests = [self.input_of(n - prefix_tokens, rng) if n > prefix_tokens else None for n in lengths]
        if isinstance(prefix, str):
            return [prefix + (" " + rest if rest else "") for rest in rests]
        return [{"input_ids": prefix["input_ids"] + (rest["input_ids"] if rest else [])} for rest in rests]

    def _generate_body(self, record: TraceRecord, index: int) -> dict[str, Any]:
        rng = random.Random(self.options.seed * 1_000_003 + index)
        prompt = self.input_of(record.prompt_tokens, rng)
        body = {"prompt": prompt} if isinstance(prompt, str) else {"input_ids": prompt["input_ids"]}
        body.update(
            beam_width=record.beam_width or self.options.beam_width,
            max_new_tokens=record.max_new_tokens or self.options.max_new_tokens,
            num_return_sequences=record.num_return_sequences or self.options.num_return_sequences,
        )
        return body


class TextSynthesizer:
    """Text of an exact token count for one tokenizer, from words that are single tokens."""

    def __init__(self, tokenizer: Any, pool_size: int = 256) -> None:
        self.tokenizer = tokenizer
        self.pieces = self._word_pieces(pool_size)
        if not self.pieces:
            raise ValueError("the tokenizer has no plain words that encode as single tokens; use ids mode")

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text_of(self, length: int, rng: random.Random) -> str:
        for _ in range(8):
            text = "".join(rng.choice(self.pieces) for _ in range(length)).strip()
            if self.count(text) == length:
                return text
        raise ValueError(f"could not build text of exactly {length} tokens with this tokenizer; use ids mode")

    def _word_pieces(self, pool_size: int) -> list[str]:
        """Pieces like ' river' (leading space kept) whose concatenations tokenize piecewise."""
        pieces = []
        for token_id in sorted(_ordinary_ids(self.tokenizer)):
            word = self.tokenizer.decode([token_id])
            bare = word.strip()
            if not (bare.isascii() and bare.isalpha() and bare.islower() and 2 <= len(bare) <= 10):
                continue
            piece = " " + bare
            if piece not in pieces and self.count(piece) == 1 and self.count(bare + piece + piece) == 3:
                pieces.append(piece)
                if len(pieces) >= pool_size:
                    break
        return pieces


def _load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises its own Exception types
        raise ValueError(f"cannot load tokenizer {path}: {exc}") from None


def _ordinary_ids(tokenizer: Any) -> list[int]:
    special = set(tokenizer.get_added_tokens_decoder()) if hasattr(tokenizer, "get_added_tokens_decoder") else set()
    return sorted(i for i in tokenizer.get_vocab(with_added_tokens=False).values() if i not in special)
