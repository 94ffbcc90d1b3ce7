"""One Kubernetes object checked against its API schema, strictly: an unknown field is an error.

Core kinds use kubernetes-validate's schemas (the package ships them: no cluster, no network) at
KUBERNETES_VERSION, the newest kubernetes-validate 1.37 ships and the version docs/operations-k8s.md
names. KEDA's ScaledObject is a custom resource with no schema there: it is checked against
data/keda_scaledobject.schema.json, written from KEDA's documented fields, and the HPA behavior it
hands to the HorizontalPodAutoscaler KEDA creates is checked as an autoscaling/v2 HPA's. Any other
kind has no schema and is reported as an error, so a new kind cannot pass unchecked.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate.utils as kubernetes_validate

KUBERNETES_VERSION = "1.37"
KEDA_SCHEMA = json.loads((Path(__file__).parent / "data" / "keda_scaledobject.schema.json").read_text())


def schema_errors(body: dict) -> list[str]:
    """What is wrong with `body` against its schema ("path: message" each); [] when it validates."""
    if not isinstance(body.get("apiVersion"), str) or not isinstance(body.get("kind"), str):
        return ["apiVersion and kind must be strings"]
    if (body["apiVersion"], body["kind"]) == ("keda.sh/v1alpha1", "ScaledObject"):
        return _keda_errors(body)
    return list(_core_errors(json.dumps(body, sort_keys=True)))


@functools.cache  # kubernetes-validate parses its 1.8 MB definitions file on every call
def _core_errors(encoded: str) -> tuple[str, ...]:
    try:
        validated = kubernetes_validate.validate(json.loads(encoded), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return (f"{'.'.join(map(str, error.path)) or '(top)'}: {error.message}",)
    except kubernetes_validate.SchemaNotFoundError as error:
        return (f"{error.message}; add a schema to tests/deploy/k8s_schemas.py",)
    assert validated == KUBERNETES_VERSION, f"validated against {validated}, not {KUBERNETES_VERSION}"
    return ()


def _keda_errors(body: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(KEDA_SCHEMA)
    errors = list(dict.fromkeys(  # one line per distinct error (a field can fail two subschemas alike)
        f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))))
    behavior = body.get("spec", {}).get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior is not None and not errors:
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": body["metadata"]["name"]},
               "spec": {"scaleTargetRef": {"kind": "StatefulSet", "name": "x"}, "maxReplicas": 1,
                        "behavior": behavior}}
        errors += [f"spec.advanced.horizontalPodAutoscalerConfig.behavior, as an HPA's: {e}"
                   for e in schema_errors(hpa)]
    return errors
