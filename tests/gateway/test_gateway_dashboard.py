"""The Grafana dashboard provisioned beside Prometheus queries only series a live gateway exports,
through the data source that is provisioned with it, from the compose stack's monitoring profile."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.gateway.metrics_page import families, scrape

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "configs" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "boundserve.json"
SERIES = re.compile(r"\b(?:boundserve|process)_[a-z_]+\b")


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


async def test_every_series_the_dashboard_queries_is_on_a_live_gateways_page(stack):
    assert (await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]}))[0] == 200
    on_page = {s.name for family in families(await scrape(stack)).values() for s in family.samples}
    named = {name for expr in queries() for name in SERIES.findall(expr)}
    assert named and named <= on_page, named - on_page


def test_the_dashboard_shows_what_an_operator_of_overload_control_watches():
    named = {name for expr in queries() for name in SERIES.findall(expr)}
    watched = {"boundserve_answered_total",                     # goodput
               "boundserve_drops_total",                        # refusals and drops by reason
               "boundserve_batch_predicted_seconds_total",      # predicted against measured service
               "boundserve_batch_service_seconds_total",
               "boundserve_wasted_compute_seconds_total",       # wasted share
               "boundserve_worker_compute_seconds_total",
               "boundserve_batch_fill_ratio_sum",               # batch fill
               "boundserve_queue_jobs"}                         # queue depth
    assert watched <= named, watched - named


def test_grafana_is_provisioned_beside_prometheus_in_the_monitoring_profile():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    assert grafana["profiles"] == compose["services"]["prometheus"]["profiles"] == ["monitoring"]
    mounts = dict(volume.removesuffix(":ro").split(":") for volume in grafana["volumes"])
    assert mounts["./configs/grafana/provisioning"] == "/etc/grafana/provisioning"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "boundserve.yml").read_text())
    assert mounts["./configs/grafana/dashboards"] == providers["providers"][0]["options"]["path"]
    (source,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    uids |= {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert uids == {source["uid"]}
