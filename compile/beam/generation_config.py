"""The checkpoint's generation_config read into a BeamRule, refusing what the beam node does not do.

Supported (matched to transformers' generate(num_beams=W, do_sample=False)): eos_token_id (one or
several), pad_token_id, length_penalty, early_stopping (True / False / "never"), repetition_penalty.
Options that would change the scores otherwise (n-gram blocking, forced or suppressed tokens,
minimum lengths, beam groups, ...) are refused with a message naming them; sampling options are ignored,
as generate(do_sample=False) ignores them.
"""

from __future__ import annotations

import json
from pathlib import Path

from compile.beam.search import BeamRule

# option -> the value that means "off" (anything else is refused)
_REFUSED = {
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "guidance_scale": None,
    "constraints": None,
    "force_words_ids": None,
    "watermarking_config": None,
}


class UnsupportedGenerationOption(ValueError):
    """The checkpoint's generation_config asks for something the beam node does not implement."""


def read_generation_config(checkpoint: str | Path) -> dict:
    """generation_config.json merged over config.json's eos/pad ids (what transformers does)."""
    checkpoint = Path(checkpoint)
    model_cfg = json.loads((checkpoint / "config.json").read_text())
    merged = {key: model_cfg.get(key) for key in ("eos_token_id", "pad_token_id")}
    gen_path = checkpoint / "generation_config.json"
    if gen_path.exists():
        gen = json.loads(gen_path.read_text())
        if not isinstance(gen, dict):
            raise UnsupportedGenerationOption(f"{gen_path}: expected a JSON object of options, got a "
                                              f"{type(gen).__name__}")
        merged.update({k: v for k, v in gen.items() if v is not None or k not in merged})
    return merged


def beam_rule(gen: dict, source: str = "generation_config") -> BeamRule:
    """Validate a generation config dict and return the rule the node compiles in."""
    for name, off in _REFUSED.items():
        value = gen.get(name)
        if value is not None and value != off and value != []:
            raise UnsupportedGenerationOption(
                f"{source}: {name}={value!r} is not supported by the beam node (only {off!r}); "
                "remove it from generation_config.json or serve this model with transformers"
            )
    eos = gen.get("eos_token_id")
    eos_ids = tuple(_token_id(e, "eos_token_id", source) for e in (eos if isinstance(eos, list) else [] if eos is None
                                                                     else [eos]))
    early = gen.get("early_stopping")
    early = False if early is None else early
    if early not in (True, False, "never"):
        raise UnsupportedGenerationOption(f"{source}: early_stopping={early!r} must be true, false or \"never\"")
    penalty = _number(gen.get("length_penalty"), "length_penalty", source)
    pad = gen.get("pad_token_id")
    pad = None if pad is None else _token_id(pad, "pad_token_id", source)
    # transformers' fill value after a beam finishes: pad_token_id, else the first EOS id.
    fill = pad if pad else (eos_ids[0] if eos_ids else 0)
    repetition = _number(gen.get("repetition_penalty"), "repetition_penalty", source)
    repetition = 1.0 if repetition is None else repetition
    if not repetition > 0:
        raise UnsupportedGenerationOption(f"{source}: repetition_penalty={repetition} must be > 0")
    return BeamRule(
        eos_ids=eos_ids, length_penalty=1.0 if penalty is None else penalty,
        early_stopping=early, pad_id=int(fill), repetition_penalty=repetition,
    )


def _token_id(value, name: str, source: str) -> int:
    """A token id of the generation config (an integer >= 0; JSON true/false and "2" are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsupportedGenerationOption(f"{source}: {name} holds {json.dumps(value)}; token ids are integers >= 0")
    return value


def _number(value, name: str, source: str) -> float | None:
    """A numeric option of the generation config, None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedGenerationOption(f"{source}: {name} = {json.dumps(value)} must be a number")
    return float(value)
