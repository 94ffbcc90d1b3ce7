"""Checkpoint loading: supported families load, anything else is refused with a message naming it."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from compile.checkpoint import UnsupportedCheckpoint, load_checkpoint, read_spec


def edited_copy(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes,message", [
    (dict(architectures=["MistralForCausalLM"]), "architecture .*MistralForCausalLM.* is not supported"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(use_sliding_window=True), "use_sliding_window=true"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "RoPE type 'yarn'"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer_types other than full_attention"),
    (dict(dtype="float8_e4m3fn"), "dtype 'float8_e4m3fn' is not supported"),
])
def test_unsupported_options_are_refused_by_name(demo_checkpoint, tmp_path, changes, message):
    path = edited_copy(demo_checkpoint, tmp_path / "edited", **changes)
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(path)


def test_unknown_weights_are_refused(demo_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(demo_checkpoint, tmp_path / "extra")
    weights = load_file(path / "model.safetensors")
    weights["model.layers.0.mlp.gate_proj.bias"] = torch.zeros(128)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedCheckpoint, match="mlp.gate_proj.bias"):
        load_checkpoint(path)


def test_a_folder_without_config_is_refused(tmp_path):
    with pytest.raises(UnsupportedCheckpoint, match="no config.json"):
        read_spec(tmp_path)


def test_sharded_checkpoint_loads_the_same_weights(demo_checkpoint, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_checkpoint / name, tmp_path / "sharded" / name)
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    single, sharded = load_checkpoint(demo_checkpoint), load_checkpoint(tmp_path / "sharded")
    assert single.state_dict.keys() == sharded.state_dict.keys()
    assert all(torch.equal(single.state_dict[k], sharded.state_dict[k]) for k in single.state_dict)


def test_spec_reads_each_family(checkpoint_factory):
    qwen3 = read_spec(checkpoint_factory("qwen3", tie_word_embeddings=True, num_key_value_heads=1, head_dim=40, rope_theta=1e6))
    assert (qwen3.family, qwen3.head_dim, qwen3.num_kv_heads, qwen3.qk_norm, qwen3.rope.theta) == ("qwen3", 40, 1, True, 1e6)
    qwen2 = read_spec(checkpoint_factory("qwen2", tie_word_embeddings=True))
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.tie_word_embeddings, qwen2.head_dim) == (True, False, True, 16)
    llama = read_spec(checkpoint_factory("llama", tie_word_embeddings=False, num_key_value_heads=1))
    assert (llama.qkv_bias, llama.qk_norm, llama.num_kv_heads) == (False, False, 1)
