"""Deployment config: every shipped config decodes; bad values are refused with the field named."""

import dataclasses
from pathlib import Path

import pytest

from shared.bounds import Bounds
from shared.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    load_config(path)


@pytest.mark.parametrize("raw,message", [
    ({"bounds": {"max_beam_width": 401}}, "bounds.max_beam_width = 401 must be an integer between 1 and 400"),
    ({"bounds": {"max_tokens_per_sample": 600, "max_tokens_per_batch": 512}}, "must not exceed bounds.max_tokens_per_batch"),
    ({"bounds": {"max_top_k": "5"}}, "bounds.max_top_k = \"5\" must be an integer"),
    ({"model": {"dtype": "int8"}}, "model.dtype = \"int8\" must be one of auto, bfloat16"),
    ({"model": {"pth": "x"}}, "unknown key\\(s\\) model.pth"),
    ({"worker": {"endpoints": ["http://x"], "devices": ["cpu"]}}, "must start with tcp:// or ipc://"),
    ({"score": {"mlp_head": {"weights": "h.safetensors"}}}, "missing required key score.mlp_head.layer_sizes \\(a list of integers\\)"),
    ({"score": {"enabled": False}, "beam": {"enabled": False}}, "at least one of score.enabled and beam.enabled"),
    ({"bounds": {"max_prefix_tokens": 0}}, "bounds.max_prefix_tokens = 0 must be an integer of at least 1"),
    ({"bounds": {"max_prefix_tokens": 600}}, "bounds.max_prefix_tokens = 600 must be between 1 and bounds.max_tokens_per_sample"),
    ({"bounds": {"max_labels": True}}, "bounds.max_labels = true must be an integer"),
    ({"gateway": {"max_batch_wait_ms": -0.5}}, "gateway.max_batch_wait_ms = -0.5 must be a number of at least 0"),
    ({"worker": {"devices": ["cpu", 3], "endpoints": ["ipc://a", "ipc://b"]}}, "worker.devices\\[1\\] = 3 must be a string"),
    ({"score": {"mlp_head": {"weights": "h", "layer_sizes": [4, 2], "act": "relu"}}}, "unknown key\\(s\\) score.mlp_head.act in score.mlp_head; known keys: activation"),
    ({"score": {"mlp_head": {"weights": "h", "layer_sizes": [4, 2], "activation": "elu"}}}, "score.mlp_head.activation = \"elu\" must be one of"),
    ({"gateway": []}, "gateway = \\[\\] must be a table with keys host, port"),
    ({"beam": {"enabled": True}, "name": 5}, "name = 5 must be a string"),
    ({"score": {"prefix_cache_mb": -1}}, "score.prefix_cache_mb = -1 must be an integer between 0 and 1048576"),
    ({"score": {"prefix_cache_mb": 1.5}}, "score.prefix_cache_mb = 1.5 must be an integer"),
    ({"score": {"prompt_template": "Q: {query"}}, "score.prompt_template 'Q: {query' may only use {text} and {query}"),
    ({"score": {"prompt_template": "{user}: {text}"}}, "may only use {text} and {query}.*'user'"),
    ({"gateway": {"auth_token_env": ""}}, "gateway.auth_token_env = \"\" must be a string of at least 1 character"),
    ({"worker": {"endpoints": [], "devices": []}}, "worker.endpoints is empty: a deployment needs at least one worker"),
    ({"worker": {"devices": ["cuda:0"]}}, "worker.devices \\['cuda:0'\\] do not match model.device = 'cpu'"),
    ({"model": {"device": "cuda"}}, "worker.devices \\['cpu'\\] do not match model.device = 'cuda'"),
    ({"gateway": {"score_deadline_ms": 100_000}}, "gateway.score_deadline_ms = 100000 is over gateway.max_deadline_ms"),
    ({"beam": {"constraints": "items.txt"}}, "beam.constraints = 'items.txt' needs beam.max_catalog_nodes and "
                                             "beam.max_catalog_fanout"),
    ({"beam": {"max_catalog_nodes": 1000}}, "beam.max_catalog_nodes = 1000 and beam.max_catalog_fanout = 0: set both"),
    ({"beam": {"max_catalog_nodes": 1, "max_catalog_fanout": 4}}, "beam.max_catalog_nodes = 1 holds only a root"),
    ({"beam": {"max_catalog_nodes": -5}}, "beam.max_catalog_nodes = -5 must be an integer between 0 and 2147483646"),
    ({"beam": {"max_catalog_fanout": "8"}}, "beam.max_catalog_fanout = \"8\" must be an integer"),
])
def test_bad_values_name_the_field(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_a_folder_or_a_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}: a folder, not a config file"):
        load_config(tmp_path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[gateway]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=f"{latin}: not UTF-8 text"):
        load_config(latin)


def test_numbers_and_lists_take_their_declared_types():
    config = parse_config({"model": {"device": "cuda"},
                           "worker": {"profile_budget_s": 2, "endpoints": ["tcp://h:1"], "devices": ["cuda:0"]}})
    assert config.worker.profile_budget_s == 2.0 and isinstance(config.worker.profile_budget_s, float)
    assert config.worker.endpoints == ("tcp://h:1",) and config.worker.devices == ("cuda:0",)


def test_resolved_bounds_fill_the_unset_prefix_bound():
    config = parse_config({"bounds": {"max_tokens_per_sample": 100}})
    assert config.bounds.resolved().max_prefix_tokens == 100 and config.bounds.max_prefix_tokens is None
    assert config.bounds.limit("max_prefix_tokens") == 100


def test_replace_checks_ranges_and_cross_field_rules_again():
    config = parse_config({})
    assert config.replace(gateway=dataclasses.replace(config.gateway, port=9)).gateway.port == 9
    with pytest.raises(ConfigError, match="bounds.max_beam_width = 0 must be an integer between 1 and 400"):
        config.replace(bounds=dataclasses.replace(config.build_bounds, max_beam_width=0))
    with pytest.raises(ConfigError, match="must not exceed bounds.max_tokens_per_batch"):
        config.replace(bounds=dataclasses.replace(config.build_bounds, max_tokens_per_batch=8))


def test_bounds_left_out_are_none_and_the_build_takes_the_defaults():
    """Leaving [bounds] out means 'serve what the artifacts were compiled for' (not a declared set of
    defaults a serving process would compare with the manifest); a build compiles the defaults."""
    config = parse_config({})
    assert config.bounds is None and config.build_bounds == Bounds()
    assert parse_config({"bounds": {"max_labels": 3}}).build_bounds.max_labels == 3
