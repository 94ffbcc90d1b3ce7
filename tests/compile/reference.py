"""Reference results from transformers' own forward pass, one sample at a time (no padding involved)."""

from __future__ import annotations

import torch


def hf_last_token(hf_model, samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-vocabulary logits [B, V] (float32) and final hidden state [B, H] at each sample's last token."""
    logits, hidden = [], []
    with torch.inference_mode():
        for ids in samples:
            out = hf_model(ids[None], output_hidden_states=True)
            logits.append(out.logits[0, -1].float())
            hidden.append(out.hidden_states[-1][0, -1].float())
    return torch.stack(logits), torch.stack(hidden)


def random_batch(vocab_size: int, lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator) for n in lengths]


def load_hf(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
