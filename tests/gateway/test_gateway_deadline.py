"""Deadline resolution: body, X-Deadline-Ms and Envoy's header; the smallest wins, else the default."""

import pytest

from gateway.api.deadline import resolve_deadline_ms
from gateway.errors import ApiError


@pytest.mark.parametrize("body_ms, headers, want", [
    (None, {}, 200),
    (150, {}, 150),
    (150, {"X-Deadline-Ms": "90"}, 90),
    (None, {"X-Deadline-Ms": "300", "x-envoy-expected-rq-timeout-ms": "120"}, 120),
    (40, {"X-Deadline-Ms": "300", "x-envoy-expected-rq-timeout-ms": "120"}, 40),
    (None, {"x-envoy-expected-rq-timeout-ms": "0"}, 200),  # Envoy: 0 means no route timeout
])
def test_the_smallest_deadline_wins(body_ms, headers, want):
    assert resolve_deadline_ms(body_ms, headers, 200, 60_000) == want


@pytest.mark.parametrize("value", ["soon", "-5", "0", "1.5", "99999999"])
def test_a_malformed_deadline_header_is_refused_by_name(value):
    with pytest.raises(ApiError) as info:
        resolve_deadline_ms(None, {"X-Deadline-Ms": value}, 200, 60_000)
    assert info.value.code == "invalid_request" and "X-Deadline-Ms" in info.value.message
