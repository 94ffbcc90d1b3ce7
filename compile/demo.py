"""Write small checkpoints with transformers (seeded random weights) and a locally trained tokenizer.

`python -m compile.demo --out DIR` writes the demo model: a Qwen3-architecture checkpoint with a
byte-level BPE tokenizer trained here with `tokenizers`, so that everything runs with no download.
Tests use `write_checkpoint` for tiny models of every supported family.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_WORDS = (
    "yes no true false good bad relevant irrelevant query document item product price shoe shirt "
    "phone case red blue green black white cheap premium fast free shipping review rating star "
    "search click buy cart user session brand store sale new used size small medium large the a "
    "of to and for with in on is are this that what which best top near me how why when where "
    "coffee tea book movie music game laptop camera watch bag hotel flight city beach summer winter"
).split()

FAMILY_CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
}
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
)


def corpus(num_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic search-and-recommendation flavoured text to train the tokenizer on."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ""]) + f" {rng.randint(0, 999)}")
    return lines


def train_tokenizer(vocab_size: int = 1024) -> Tokenizer:
    """A byte-level BPE tokenizer trained on `corpus()`; ids 0..2 are the special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    """tokenizer.json plus the transformers config files, eos = <|im_end|>, pad = <|endoftext|>."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None, clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(out)


def write_checkpoint(
    out: str | Path, family: str = "qwen3", tokenizer: Tokenizer | None = None, seed: int = 0,
    dtype: torch.dtype = torch.float32, **overrides,
) -> Path:
    """Write a random-weight checkpoint of `family` with transformers' own save_pretrained."""
    import transformers

    out = Path(out)
    tokenizer = tokenizer or train_tokenizer()
    config_cls, model_cls = (getattr(transformers, name) for name in FAMILY_CONFIGS[family])
    fields = {**TINY, "vocab_size": tokenizer.get_vocab_size(), **overrides}
    fields.setdefault("eos_token_id", tokenizer.token_to_id("<|im_end|>"))
    fields.setdefault("pad_token_id", tokenizer.token_to_id("<|endoftext|>"))
    if family == "qwen3":
        fields.setdefault("head_dim", 24)  # deliberately != hidden_size / num_attention_heads
    config = config_cls(**fields)
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    with torch.no_grad():  # random init is tiny; widen it so that outputs are not all alike
        for param in model.parameters():
            if param.dim() >= 1 and param.dtype.is_floating_point:
                param.normal_(0.0, 0.08 if param.dim() == 2 else 0.5).add_(1.0 if param.dim() == 1 else 0.0)
    model.generation_config.eos_token_id = fields["eos_token_id"]
    model.generation_config.pad_token_id = fields["pad_token_id"]
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--family", default="qwen3", choices=sorted(FAMILY_CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = train_tokenizer(vocab_size=2048)
    demo = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2)
    if args.family == "qwen3":
        demo["head_dim"] = 48
    path = write_checkpoint(args.out, args.family, tokenizer, seed=args.seed, **demo)
    print(f"wrote {args.family} demo checkpoint to {path}")


if __name__ == "__main__":
    main()
