"""Reading the gateway's /metrics in tests: prometheus_client's own parser, one sample at a time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


async def scrape(stack, **headers: str) -> str:
    """GET /metrics of a running stack (tests/gateway/conftest.py), as text."""
    response = await stack.client.get("/metrics", headers=headers)
    assert response.status == 200
    return await response.text()


def families(text: str) -> dict:
    """{family name: Metric} of a page; the parser raises on anything that is not the text format."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` with exactly `labels`, None when the page has none."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None
