"""Fixtures shared by the compile tests: compiled scoring artifacts for the other two families."""

import torch
from safetensors.torch import save_file

from shared.config import MlpHeadConfig, ScoreConfig
from tests.builds import build_artifacts, suite_build


def head_weights(path, sizes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        tensors[f"layers.{i}.weight"] = torch.randn(b, a, generator=generator) * 0.2
        tensors[f"layers.{i}.bias"] = torch.randn(b, generator=generator) * 0.2
    save_file(tensors, path)
    return tensors


@suite_build(compile_s=60)
def qwen2_with_head(make, folder):
    """Qwen2 (q/k/v bias, MHA, tied embeddings) with a 64 -> 16 -> 3 MLP head (gelu)."""
    path = make("qwen2", tie_word_embeddings=True, num_key_value_heads=4)
    weights_file = folder / "head.safetensors"
    tensors = head_weights(weights_file, [64, 16, 3])
    score = ScoreConfig(mlp_head=MlpHeadConfig(weights=str(weights_file), layer_sizes=(64, 16, 3), activation="gelu"))
    return path, build_artifacts(path, "qwen2-head", score=score), tensors


@suite_build(compile_s=60)
def llama_artifacts(make, folder):
    """Llama, GQA 4:1, untied embeddings; its linears on aten's GEMM (`[model] gemm = "aten"`) on every CPU
    (tests/compile/test_linear.py); the other float builds take what "auto" takes here, but beam_artifacts,
    which asks for oneDNN."""
    path = make("llama", tie_word_embeddings=False, num_key_value_heads=1)
    return path, build_artifacts(path, "llama", model={"gemm": "aten"})
