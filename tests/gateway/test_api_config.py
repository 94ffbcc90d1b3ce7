"""The config sections of the standard routes and of tracing: defaults, and each bad value refused
naming the key and the fix."""

from __future__ import annotations

import pytest

from shared.config import QWEN3_RERANKER_TEMPLATE, ConfigError, parse_config


def test_defaults_are_the_qwen3_reranker_recipe_last_token_pooling_and_tracing_off():
    config = parse_config({})
    assert config.rerank.template == QWEN3_RERANKER_TEMPLATE and config.rerank.labels == ("yes", "no")
    assert QWEN3_RERANKER_TEMPLATE.index("{query}") < QWEN3_RERANKER_TEMPLATE.index("{document}")  # query shared
    assert config.embeddings.pooling == "last"
    assert not config.telemetry.enabled


@pytest.mark.parametrize("raw, message", [
    ({"rerank": {"template": "Q: {query}"}}, "must use both {query} and {document}"),
    ({"rerank": {"template": "{query} {document} {text}"}}, "rerank.template may only use"),
    ({"rerank": {"template": "{query} {document"}}, "rerank.template may only use"),
    ({"rerank": {"labels": []}}, "one label .* or two distinct ones"),
    ({"rerank": {"labels": ["yes", "yes"]}}, "two distinct ones"),
    ({"rerank": {"labels": ["yes", "no", "maybe"]}}, "two distinct ones"),
    ({"rerank": {"instruction": "x"}}, "unknown key.*rerank.instruction"),
    ({"embeddings": {"pooling": "mean"}}, "last token only"),
    ({"embeddings": {"pooling": "cls"}}, "embeddings.pooling"),
    ({"telemetry": {"endpoint": "localhost:4318"}}, "http:// or https://"),
    ({"telemetry": {"export_timeout_ms": 0}}, "telemetry.export_timeout_ms"),
    ({"telemetry": {"service_name": ""}}, "telemetry.service_name"),
    ({"telemetry": {"sample_ratio": 1.5}}, "telemetry.sample_ratio"),
])
def test_bad_values_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)
