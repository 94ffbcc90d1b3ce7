"""Hugging Face checkpoint folders -> a validated ModelSpec and a state dict in our own layout.

Supported families: Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm, free head_dim) and Llama. Anything the
model core does not implement (another architecture, sliding windows, a RoPE variant, an unknown
weight) is refused with a message naming it: never silently mis-computed.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

ARCHITECTURES = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json", "config.json",
)


class UnsupportedCheckpoint(ValueError):
    """The checkpoint uses an architecture or option the model core does not implement."""


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding parameters: the checkpoint's theta and, for Llama 3, its frequency scaling."""

    theta: float
    kind: str = "default"  # default | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 1.0
    original_max_position: int = 0

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """Inverse frequencies [head_dim / 2], float32, as the family computes them."""
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if self.kind == "llama3":
            inv = _llama3_scaled(inv, self)
        return inv


@dataclass(frozen=True)
class ModelSpec:
    """The shapes and options of one checkpoint, all the model core needs to build it."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    dtype: str  # the checkpoint's own dtype
    max_position_embeddings: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def non_embedding_params(self) -> int:
        """Parameters touched per token outside the embedding and the LM head (for FLOP counts)."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attn + mlp)


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its spec, weights in our layout, and where it came from."""

    path: Path
    spec: ModelSpec
    state_dict: dict[str, torch.Tensor]
    sha256: str


def read_spec(path: str | Path) -> ModelSpec:
    """Read and validate config.json of a checkpoint folder."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UnsupportedCheckpoint(f"{path}: no config.json; expected a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(config_file.read_bytes())
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise UnsupportedCheckpoint(f"{config_file}: not valid JSON: {exc}") from None
    return spec_from_config(cfg, source=str(config_file))


def spec_from_config(cfg: dict, source: str = "config") -> ModelSpec:
    """The ModelSpec of a parsed config.json; every value the model core uses is checked for its type
    here, so a hand-edited config is refused naming the key, not failing somewhere in the build."""
    if not isinstance(cfg, dict):
        raise UnsupportedCheckpoint(f"{source}: expected a JSON object of settings, got a {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    family = ARCHITECTURES.get(archs[0]) if len(archs) == 1 and isinstance(archs[0], str) else None
    if family is None:
        raise UnsupportedCheckpoint(
            f"{source}: architecture {archs or cfg.get('model_type')!r} is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    heads = _int(cfg, "num_attention_heads", source)
    kv_heads = _int(cfg, "num_key_value_heads", source, default=None) or heads
    hidden = _int(cfg, "hidden_size", source)
    _refuse_unsupported_options(cfg, family, source, heads, kv_heads)
    return ModelSpec(
        family=family,
        vocab_size=_int(cfg, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", source),
        num_layers=_int(cfg, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_int(cfg, "head_dim", source, default=None) or hidden // heads,
        rms_norm_eps=_float(cfg, "rms_norm_eps", source, 1e-6),
        rope=_rope_spec(cfg, source),
        qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=family != "qwen2" and bool(cfg.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype=_checkpoint_dtype(cfg, source),
        max_position_embeddings=_int(cfg, "max_position_embeddings", source, default=32768),
    )


_REQUIRED = object()


def _absent(key: str, source: str, default):
    """The default of a setting config.json lacks (or sets to null, as transformers writes unset options)."""
    if default is _REQUIRED:
        raise UnsupportedCheckpoint(f"{source}: missing key {key!r}")
    return default


def _int(cfg: dict, key: str, source: str, default=_REQUIRED) -> int | None:
    """A positive integer setting of config.json (JSON true/false and "4" are refused, not converted)."""
    value = cfg.get(key)
    if value is None:
        return _absent(key, source, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedCheckpoint(f"{source}: {key} = {json.dumps(value)} must be a positive integer")
    return value


def _float(cfg: dict, key: str, source: str, default=_REQUIRED) -> float:
    """A number setting of config.json (or of one of its tables, such as rope_scaling)."""
    value = cfg.get(key)
    if value is None:
        return _absent(key, source, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedCheckpoint(f"{source}: {key} = {json.dumps(value)} must be a number")
    return float(value)


def _table(cfg: dict, key: str, source: str) -> dict:
    """A JSON object setting of config.json (absent or null: empty)."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnsupportedCheckpoint(f"{source}: {key} = {json.dumps(value)} must be a JSON object")
    return value


def _refuse_unsupported_options(cfg: dict, family: str, source: str, heads: int, kv: int) -> None:
    problems = []
    if cfg.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={cfg['hidden_act']!r} (only silu)")
    if cfg.get("use_sliding_window"):
        problems.append("use_sliding_window=true (sliding-window attention)")
    layer_types = cfg.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise UnsupportedCheckpoint(f"{source}: layer_types = {json.dumps(layer_types)} must be a list")
    if any(t != "full_attention" for t in layer_types):
        problems.append(f"layer_types other than full_attention: {sorted(set(map(str, layer_types)))}")
    if cfg.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if _float(cfg, "partial_rotary_factor", source, 1.0) != 1.0:
        problems.append(f"partial_rotary_factor={cfg['partial_rotary_factor']}")
    if cfg.get("pretraining_tp", 1) not in (1, None):
        problems.append(f"pretraining_tp={cfg['pretraining_tp']}")
    if family == "qwen2" and cfg.get("attention_bias") is False:
        problems.append("attention_bias=false on a Qwen2 checkpoint")
    if heads % kv:
        problems.append(f"num_attention_heads={heads} not a multiple of num_key_value_heads={kv}")
    if problems:
        raise UnsupportedCheckpoint(f"{source}: unsupported config option(s): {'; '.join(problems)}")


def _rope_spec(cfg: dict, source: str) -> RopeSpec:
    params = dict(_table(cfg, "rope_parameters", source))
    params.update({k: v for k, v in _table(cfg, "rope_scaling", source).items() if v is not None})
    params.setdefault("rope_theta", cfg.get("rope_theta"))
    theta = _float(params, "rope_theta", source, 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return RopeSpec(theta=theta)
    if kind == "llama3":
        return RopeSpec(
            theta=theta, kind="llama3", factor=_float(params, "factor", source),
            low_freq_factor=_float(params, "low_freq_factor", source),
            high_freq_factor=_float(params, "high_freq_factor", source),
            original_max_position=_int(params, "original_max_position_embeddings", source),
        )
    raise UnsupportedCheckpoint(f"{source}: RoPE type {kind!r} is not supported (default, llama3)")


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    # Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, smooth between.
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _checkpoint_dtype(cfg: dict, source: str) -> str:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").removeprefix("torch.")
    if name not in DTYPES:
        raise UnsupportedCheckpoint(f"{source}: checkpoint dtype {name!r} is not supported ({', '.join(DTYPES)})")
    return name


def load_checkpoint(path: str | Path, dtype: str = "auto", sha256: str | None = None) -> Checkpoint:
    """Load spec and weights (one or sharded *.safetensors), mapped to the model core's names."""
    path = Path(path)
    spec = read_spec(path)
    target = DTYPES[spec.dtype if dtype == "auto" else dtype]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedCheckpoint(f"{path}: no *.safetensors weights (other formats are not supported)")
    raw = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    raw[name] = f.get_tensor(name)
        except (SafetensorError, OSError) as exc:  # truncated or not a safetensors file; unreadable
            raise UnsupportedCheckpoint(f"{file}: cannot read the weights ({exc}); the file is damaged or "
                                        f"incomplete (an interrupted download?)") from None
    state = convert_weights(raw, spec, target, source=str(path))
    return Checkpoint(path=path, spec=spec, state_dict=state, sha256=sha256 or checkpoint_hash(path))


def convert_weights(raw: dict[str, torch.Tensor], spec: ModelSpec, dtype: torch.dtype, source: str) -> dict:
    """HF tensor names -> ours, with q/k/v fused into qkv (gate and up stay apart: compile/model.Mlp)."""
    raw = {k.removeprefix("model."): v for k, v in raw.items()}
    used = set()

    def take(name: str) -> torch.Tensor:
        if name not in raw:
            raise UnsupportedCheckpoint(f"{source}: missing weight {name!r}")
        used.add(name)
        return raw[name].to(dtype)

    state = {"embed.weight": take("embed_tokens.weight"), "norm.weight": take("norm.weight")}
    if spec.tie_word_embeddings:
        used.add("lm_head.weight")  # some tied checkpoints store the copy anyway
    else:
        state["lm_head.weight"] = take("lm_head.weight")
    for i in range(spec.num_layers):
        hf, ours = f"layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        state[ours + "attn.qkv.weight"] = torch.cat([take(attn + p + "_proj.weight") for p in "qkv"])
        if spec.qkv_bias:
            state[ours + "attn.qkv.bias"] = torch.cat([take(attn + p + "_proj.bias") for p in "qkv"])
        state[ours + "attn.o.weight"] = take(attn + "o_proj.weight")
        if spec.o_bias:
            state[ours + "attn.o.bias"] = take(attn + "o_proj.bias")
        if spec.qk_norm:
            state[ours + "attn.q_norm.weight"] = take(attn + "q_norm.weight")
            state[ours + "attn.k_norm.weight"] = take(attn + "k_norm.weight")
        mlp = hf + "mlp."
        state[ours + "mlp.gate.weight"] = take(mlp + "gate_proj.weight")
        state[ours + "mlp.up.weight"] = take(mlp + "up_proj.weight")
        state[ours + "mlp.down.weight"] = take(mlp + "down_proj.weight")
        state[ours + "input_norm.weight"] = take(hf + "input_layernorm.weight")
        state[ours + "post_attn_norm.weight"] = take(hf + "post_attention_layernorm.weight")
    unknown = sorted(set(raw) - used - {k for k in raw if k.endswith("rotary_emb.inv_freq")})
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UnsupportedCheckpoint(f"{source}: weights the model core does not use (unsupported option?): {shown}")
    return state


def checkpoint_hash(path: str | Path) -> str:
    """SHA-256 over config.json and every weight file (name, size and content)."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()
