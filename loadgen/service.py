"""Service time of a batch for the simulator: any callable, or the workers' fitted latency models.

A service-time function is `fn(route, batch_size, tokens) -> ms` with the convention of
shared/latency_model.py: score B = samples in the batch, L = mean tokens per sample; generate
B = beams of all requests in the batch, L = mean prompt tokens. `ServiceModel` wraps one
LatencyModel per route ("generate" uses the "beam" model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.events import PROFILE_EVENTS, parse_events
from shared.latency_model import LatencyModel

ServiceFn = Callable[[str, float, float], float]
ROUTE_TO_WORKLOAD = {"score": "score", "generate": "beam"}


@dataclass(frozen=True)
class ServiceModel:
    """T_ms per route from fitted latency models; a route without a model is an error when used."""

    models: Mapping[str, LatencyModel]

    def __call__(self, route: str, batch_size: float, tokens: float) -> float:
        workload = ROUTE_TO_WORKLOAD.get(route, route)
        model = self.models.get(workload) or self.models.get(route)
        if model is None:
            raise ValueError(f"no latency model for route {route!r} (have {sorted(self.models)})")
        return model.predict_ms(batch_size, tokens)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {name: model.to_dict() for name, model in self.models.items()}


def load_service_model(spec: str) -> ServiceModel:
    """From a JSON file or inline JSON: {"score": {alpha..delta}, "beam": {...}}, a single
    {alpha..delta} (used for every route), or "alpha,beta,gamma,delta" (every route).
    A file may also nest the models under "latency_models" or "profiles" (worker profile dumps), or
    be a gateway/worker log of JSON lines: the last profile a worker logged per workload is used
    ("profiled" at start-up, "profile_reused" from its cache, "profile_refitted" in the background)."""
    text = spec.strip()
    if not text.startswith("{") and Path(text).exists():
        text = Path(text).read_text()
        profiled = _profiled_events(text)
        if profiled:
            return service_model_from_dict(profiled)
    if not text.lstrip().startswith("{"):
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"latency model {spec!r}: not a file, JSON, or alpha,beta,gamma,delta") from None
        if len(values) != 4:
            raise ValueError(f"latency model {spec!r}: need 4 numbers alpha,beta,gamma,delta")
        model = LatencyModel(*values)
        return ServiceModel({"score": model, "beam": model})
    return service_model_from_dict(json.loads(text))


def service_model_from_dict(raw: Mapping[str, Any]) -> ServiceModel:
    for key in ("latency_models", "profiles"):
        if isinstance(raw.get(key), Mapping):
            raw = raw[key]
    if "alpha" in raw:
        model = LatencyModel.from_dict(raw)
        return ServiceModel({"score": model, "beam": model})
    models = {}
    for name, value in raw.items():
        if not isinstance(value, Mapping):
            continue
        models[ROUTE_TO_WORKLOAD.get(name, name)] = LatencyModel.from_dict(value)
    if not models:
        raise ValueError("latency model JSON holds no {alpha, beta, gamma, delta} map")
    return ServiceModel(models)


def _profiled_events(text: str) -> dict[str, dict[str, float]]:
    """{workload: coefficients} of the last profile event (shared/events.py) per workload in `text`."""
    return {e.workload: e.coefficients() for e in parse_events(text) if isinstance(e, PROFILE_EVENTS)}
