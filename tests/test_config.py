"""Deployment config: every shipped config decodes; bad values are refused with the field named."""

from pathlib import Path

import pytest

from shared.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    load_config(path)


@pytest.mark.parametrize("raw,message", [
    ({"bounds": {"max_beam_width": 401}}, "bounds.max_beam_width = 401 must be between 1 and 400"),
    ({"bounds": {"max_tokens_per_sample": 600, "max_tokens_per_batch": 512}}, "must not exceed bounds.max_tokens_per_batch"),
    ({"bounds": {"max_top_k": "5"}}, "bounds.max_top_k must be int"),
    ({"model": {"dtype": "int8"}}, "model.dtype = 'int8' is not one of"),
    ({"model": {"pth": "x"}}, "unknown key\\(s\\) model.pth"),
    ({"worker": {"endpoints": ["http://x"], "devices": ["cpu"]}}, "must start with tcp:// or ipc://"),
    ({"score": {"mlp_head": {"weights": "h.safetensors"}}}, "missing required key\\(s\\): score.mlp_head.layer_sizes"),
    ({"score": {"enabled": False}, "beam": {"enabled": False}}, "at least one of score.enabled and beam.enabled"),
])
def test_bad_values_name_the_field(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
