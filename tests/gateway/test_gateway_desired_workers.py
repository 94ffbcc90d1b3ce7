"""boundserve_desired_workers: the workers the offered load needs at its deadlines (gateway/demand.py).

It is `loadgen tune --capacity`'s model (shared/policy/capacity.py): on the same trace and latency
model the gateway's count equals the `desired_workers` the command reports, and its ceiling the
command's Kingman count. Through the real routes every request is an arrival with its items,
tokens and deadline budget, and /metrics exposes the count under exactly the name the KEDA and HPA
manifests scale on.
"""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.demand import Demand
from loadgen.__main__ import main as loadgen_main
from loadgen.service import ROUTE_TO_WORKLOAD
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import read_trace, write_trace
from shared.latency_model import LatencyModel
from shared.policy.capacity import WorkloadFacts, desired_workers, kingman_workers
from tests.deploy.test_k8s_manifests import METRIC

MODELS = {"score": LatencyModel(0.02, 0.01, 0.1, 1.0), "beam": LatencyModel(0.03, 0.02, 0.2, 2.0)}
SLO_MS = 120.0
BEAM_WIDTH = 8


def offered(trace) -> Demand:
    """A gateway's demand fed the trace's requests as its routes record them."""
    demand = Demand(window_s=math.inf)
    for record in trace.records:
        items, tokens = record.shape(BEAM_WIDTH)
        arrival = demand.arrive(record.t_ms / 1000.0, ROUTE_TO_WORKLOAD[record.route], items, record.deadline_ms)
        arrival.tokens_per_item = tokens
    return demand


@pytest.mark.parametrize("rate_rps", [40.0, 160.0])
def test_the_gauge_equals_loadgen_tune_capacity_on_the_same_trace(tmp_path, capsys, rate_rps):
    trace = synthesize(SynthSpec(rate_rps=rate_rps, duration_s=5.0, score_fraction=0.7, samples=6, samples_cv=0.5,
                                 tokens_per_sample=40, tokens_cv=0.5, prompt_tokens=24, beam_width=BEAM_WIDTH,
                                 deadline_ms=SLO_MS, seed=3))
    write_trace(trace, tmp_path / "trace.jsonl")
    trace = read_trace(tmp_path / "trace.jsonl")  # as the command reads it
    model = json.dumps({workload: m.to_dict() for workload, m in MODELS.items()})
    assert loadgen_main(["tune", "--trace", str(tmp_path / "trace.jsonl"), "--slo-ms", str(SLO_MS), "--offline",
                         "--latency-model", model, "--beam-width", str(BEAM_WIDTH), "--capacity",
                         "--grid", "max_batch_wait_ms=2", "--max-workers", "16",
                         "--out", str(tmp_path / "tune.json")]) == 0
    capacity = json.loads((tmp_path / "tune.json").read_text())["capacity"]
    gauge = offered(trace).desired_workers(trace.records[-1].t_ms / 1000.0, MODELS.get)
    assert gauge == pytest.approx(capacity["desired_workers"], rel=1e-12)
    assert math.ceil(gauge) == capacity["kingman_workers"]
    assert 0 < gauge < 16 and gauge != int(gauge)  # a load that needs some workers, reported unrounded
    assert f"{capacity['desired_workers']:.2f} fractional" in capsys.readouterr().out


def test_the_fractional_count_is_where_the_estimate_crosses_the_slo():
    facts = WorkloadFacts(rate_rps=300.0, ca=1.0, tau_ms=10.0, cs=0.5, tau_pct_ms=20.0)
    count = desired_workers(facts, SLO_MS)
    assert math.ceil(count) == kingman_workers(facts, SLO_MS)
    assert desired_workers(facts, SLO_MS * 2) < count  # a looser deadline needs fewer
    assert desired_workers(WorkloadFacts(600.0, 1.0, 10.0, 0.5, 20.0), SLO_MS) > count  # more load, more
    assert desired_workers(WorkloadFacts(0.0, 0.0, 10.0, 0.5, 20.0), SLO_MS) == 0.0
    # A deadline no count of workers can meet (a request alone is longer): the workers the load keeps busy.
    assert desired_workers(WorkloadFacts(300.0, 1.0, 10.0, 0.5, 200.0), SLO_MS) == pytest.approx(3.0)


async def test_metrics_exposes_the_count_the_routes_offered_under_the_manifests_name(stack):
    samples = ["red running shoe", "blue phone case", "cheap coffee"]
    page = await stack.client.get("/metrics")
    assert value(await page.text()) == 0.0  # no arrivals yet
    for _ in range(4):
        status, body, _ = await stack.post("/v1/score", {"samples": samples, "labels": ["yes", "no"],
                                                         "deadline_ms": 5000})
        assert status == 200, body
    status, body, _ = await stack.post("/v1/generate", {"prompt": "red running", "beam_width": 4,
                                                        "max_new_tokens": 2, "deadline_ms": 5000})
    assert status == 200, body
    arrivals = list(stack.gateway.metrics.demand.arrivals)
    assert [(a.workload, a.items) for a in arrivals] == [("score", 3)] * 4 + [("beam", 4)]
    assert all(a.tokens_per_item and 0 < a.budget_ms <= 5000 for a in arrivals)
    page = await stack.client.get("/metrics")
    exported = value(await page.text())
    pool = stack.gateway.pool
    assert exported > 0
    assert exported == pytest.approx(stack.gateway.metrics.demand.desired_workers(pool.clock(), pool.model), rel=0.05)


def value(page: str) -> float:
    """The one sample of METRIC on a /metrics page (exactly that name, unlabelled)."""
    (family,) = [f for f in text_string_to_metric_families(page) if f.name == METRIC]
    (sample,) = family.samples
    assert sample.name == METRIC and not sample.labels
    return sample.value
