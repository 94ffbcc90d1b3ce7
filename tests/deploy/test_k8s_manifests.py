"""deploy/k8s validates strictly at the Kubernetes version the docs name, and deploys what it promises.

Every kustomization folder (deploy/k8s, base, keda, hpa) is rendered as kustomize renders it and each
object checked: core kinds with kubernetes-validate --strict, KEDA's ScaledObject with a schema from
KEDA's documented fields (tests/deploy/k8s_checks.py lists every check). Broken copies in tmp_path
show that each kind of mistake is caught. The ConfigMap is generated from configs/k8s.toml, hashed
like kustomize does, and every pod mounts it under the generated name. The autoscalers scale the
worker StatefulSet on boundserve_desired_workers so that replicas = the sum over gateways of the
workers the offered load needs. Where `kubectl` (which has kustomize built in) is on PATH, the
rendering is compared with `kubectl kustomize`'s; without it those tests skip and say so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate.utils as kubernetes_validate
import pytest
import yaml

from tests.deploy.k8s_checks import kustomization_folders, problems
from tests.deploy.k8s_schemas import KUBERNETES_VERSION
from tests.deploy.kustomize import config_map_references, kustomize_hash, render
from tests.deploy.stack import K8S_DIR, ROOT, k8s_documents, module_and_flags

METRIC = "boundserve_desired_workers"  # the gateway's gauge: workers the offered load needs at its deadlines
KUBECTL = shutil.which("kubectl")


def objects(folder: Path) -> dict[tuple[str, str], dict]:
    return {r.kind_name: r.body for r in render(folder)}


def tree_copy(tmp_path: Path) -> Path:
    """deploy/k8s and the generator's inputs (configs/kustomization.yaml, k8s.toml) under tmp_path."""
    shutil.copytree(K8S_DIR, tmp_path / "deploy" / "k8s")
    (tmp_path / "configs").mkdir()
    for name in ("kustomization.yaml", "k8s.toml"):
        shutil.copy(ROOT / "configs" / name, tmp_path / "configs" / name)
    return tmp_path


def edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative}: the breakage's anchor {old!r} is not there once"
    path.write_text(text.replace(old, new))


def test_every_manifest_validates_strictly_and_every_reference_resolves():
    folders = {str(f.relative_to(K8S_DIR)) for f in kustomization_folders(ROOT)}
    assert folders == {".", "base", "keda", "hpa"}
    assert problems(ROOT) == []


def test_the_kubernetes_version_is_the_newest_the_schemas_ship_and_the_one_the_docs_name():
    assert kubernetes_validate.major_minor(kubernetes_validate.latest_version()) == KUBERNETES_VERSION
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {m for path in docs for m in re.findall(r"Kubernetes (\d+\.\d+)", path.read_text())}
    assert named == {KUBERNETES_VERSION}, f"the docs name Kubernetes {sorted(named)}"


def test_an_unchanged_copy_has_no_problems(tmp_path):
    assert problems(tree_copy(tmp_path)) == []


BREAKAGES = {  # name: (file, anchor, replacement, what the problem says)
    "unknown-field": ("deploy/k8s/base/worker.yaml", "  replicas: 2\n", "  replica: 2\n", "'replica' was unexpected"),
    "wrong-type": ("deploy/k8s/base/gateway.yaml", "replicas: 2", "replicas: two", "'two' is not of type 'integer'"),
    "keda-unknown-field": ("deploy/k8s/keda/scaledobject.yaml", "maxReplicaCount: 8", "maxReplicas: 8",
                           "'maxReplicas' was unexpected"),
    "keda-number-threshold": ("deploy/k8s/keda/scaledobject.yaml", 'threshold: "1"', "threshold: 1",
                              "1 is not of type 'string'"),
    "keda-bad-behavior": ("deploy/k8s/keda/scaledobject.yaml", "stabilizationWindowSeconds: 0",
                          "stabilizationWindow: 0", "as an HPA's"),
    "hpa-unknown-field": ("deploy/k8s/hpa/hpa.yaml", 'averageValue: "1"', 'averageValues: "1"',
                          "'averageValues' was unexpected"),
    "missing-config-map": ("deploy/k8s/base/compile-job.yaml", "configMap: {name: boundserve-config}",
                           "configMap: {name: boundserve-configs}", "names ConfigMap 'boundserve-configs'"),
    "missing-generator-file": ("configs/kustomization.yaml", "- k8s.toml", "- k8s-missing.toml",
                               "generator file 'k8s-missing.toml' does not exist"),
    "config-key-missing": ("configs/kustomization.yaml", "- k8s.toml", "- settings.toml=k8s.toml",
                           "has no key 'k8s.toml'"),
    "missing-resource": ("deploy/k8s/base/kustomization.yaml", "- gateway.yaml", "- gateways.yaml",
                         "resource 'gateways.yaml' does not exist"),
    "overlay-patch-misses": ("deploy/k8s/hpa/kustomization.yaml", "name: boundserve-worker}",
                             "name: boundserve-workers}", "matches no object"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_copy_fails(tmp_path, breakage):
    relative, old, new, expected = BREAKAGES[breakage]
    root = tree_copy(tmp_path)
    edit(root, relative, old, new)
    found = problems(root)
    assert any(expected in problem for problem in found), "\n".join(found) or "no problem found"


def test_an_unlisted_or_hand_written_manifest_fails(tmp_path):
    root = tree_copy(tmp_path)
    (root / "deploy/k8s/base/extra.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\ndata: {a: b}\n")
    found = problems(root)
    assert any("extra.yaml: not a resource of deploy/k8s/base/kustomization.yaml" in p for p in found), found
    assert any("extra.yaml: a hand-written ConfigMap 'extra'" in p for p in found), found


def test_an_overlay_inside_the_folder_of_its_base_fails_as_kustomize_refuses_it(tmp_path):
    """Why the shared objects live in base/: kustomize reports a cycle when a base contains its overlay."""
    root = tree_copy(tmp_path)
    (root / "deploy/k8s/base/variant").mkdir()
    (root / "deploy/k8s/base/variant/kustomization.yaml").write_text("resources:\n  - ..\n")
    found = problems(root)
    assert any(p.startswith("deploy/k8s/base/variant: does not render") and "cycle" in p for p in found), found


def test_the_config_map_is_generated_from_configs_k8s_toml():
    rendered = objects(K8S_DIR)
    (config_map,) = [body for (kind, _), body in rendered.items() if kind == "ConfigMap"]
    data = {"k8s.toml": (ROOT / "configs/k8s.toml").read_text()}
    assert config_map["data"] == data
    assert config_map["metadata"]["name"] == f"boundserve-config-{kustomize_hash(data)}"
    mounted = {ref["name"] for body in rendered.values() for ref in config_map_references(body)}
    assert mounted == {config_map["metadata"]["name"]}  # the gateway, the workers and the compile Job
    workloads = [kind for (kind, _), body in rendered.items() if list(config_map_references(body))]
    assert sorted(workloads) == ["Deployment", "Job", "StatefulSet"]


def test_an_edit_of_k8s_toml_renames_the_config_map_in_every_pod_spec(tmp_path):
    """The hash suffix is kept on purpose: a changed config is a new name, so the pods that read it roll."""
    root = tree_copy(tmp_path)
    before = objects(root / "deploy/k8s")
    edit(root, "configs/k8s.toml", "generate_deadline_ms = 200", "generate_deadline_ms = 250")
    after = objects(root / "deploy/k8s")
    (old_name,) = [name for kind, name in before if kind == "ConfigMap"]
    (new_name,) = [name for kind, name in after if kind == "ConfigMap"]
    assert old_name != new_name and new_name.startswith("boundserve-config-")
    workloads = [("Deployment", "boundserve-gateway"), ("StatefulSet", "boundserve-worker"),
                 ("Job", "boundserve-compile")]
    for key in workloads:
        assert [ref["name"] for ref in config_map_references(after[key])] == [new_name]


def test_the_hash_is_kustomizes():
    # Names printed by `kubectl kustomize` (kubectl v1.32.4, kustomize v5.5.0) for these contents.
    assert kustomize_hash({"k8s.toml": "a = 1\n"}) == "gg7hm2fk7k"
    tricky = 'name = "<a&b>"\n# caf\u00e9 \u2028 tab\there\n'
    assert kustomize_hash({"a.toml": tricky}) == "bfb4h8tdd9"
    assert kustomize_hash({"b.toml": "x = 2\n", "renamed.toml": tricky}) == "2b5cdhf59m"


def test_the_plain_deployment_has_a_fixed_worker_count_and_no_autoscaler():
    rendered = objects(K8S_DIR)
    assert not [kind for kind, _ in rendered if kind in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert rendered[("StatefulSet", "boundserve-worker")]["spec"]["replicas"] >= 1


@pytest.mark.parametrize("variant, autoscaler", [("keda", "ScaledObject"), ("hpa", "HorizontalPodAutoscaler")])
def test_each_autoscaling_variant_is_the_base_plus_its_autoscaler_minus_the_fixed_count(variant, autoscaler):
    base, scaled = objects(K8S_DIR / "base"), objects(K8S_DIR / variant)
    assert [key for key in scaled if key not in base] == [(autoscaler, "boundserve-worker")]
    del base[("StatefulSet", "boundserve-worker")]["spec"]["replicas"]  # the autoscaler owns it
    assert {key: body for key, body in scaled.items() if key in base} == base


def worker_statefulset(rendered: dict, target: dict) -> dict:
    workers = rendered[(target["kind"], target["name"])]
    assert (target["apiVersion"], target["kind"]) == (workers["apiVersion"], "StatefulSet")
    (container,) = workers["spec"]["template"]["spec"]["containers"]
    assert module_and_flags(container["command"])[0] == "worker"
    return workers


def test_keda_sets_the_worker_count_to_the_summed_desired_workers():
    rendered = objects(K8S_DIR / "keda")
    spec = rendered[("ScaledObject", "boundserve-worker")]["spec"]
    worker_statefulset(rendered, spec["scaleTargetRef"])
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    # AverageValue with threshold 1: replicas = ceil(query / 1) whatever the current count is.
    assert trigger["metricType"] == "AverageValue" and float(trigger["metadata"]["threshold"]) == 1.0
    assert trigger["metadata"]["query"] == f"sum({METRIC})"  # each gateway reports its own share
    assert trigger["metadata"]["ignoreNullValues"] == "false"  # a lost metric falls back, never reads as 0
    static_count = objects(K8S_DIR)[("StatefulSet", "boundserve-worker")]["spec"]["replicas"]
    assert 1 <= spec["minReplicaCount"] <= static_count <= spec["maxReplicaCount"]
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]


def test_the_hpa_sets_the_worker_count_to_the_external_desired_workers():
    rendered = objects(K8S_DIR / "hpa")
    spec = rendered[("HorizontalPodAutoscaler", "boundserve-worker")]["spec"]
    worker_statefulset(rendered, spec["scaleTargetRef"])
    (metric,) = spec["metrics"]
    assert metric["type"] == "External"  # the gateways export it, not the pods being scaled
    assert metric["external"]["metric"]["name"] == METRIC
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    static_count = objects(K8S_DIR)[("StatefulSet", "boundserve-worker")]["spec"]["replicas"]
    assert 1 <= spec["minReplicas"] <= static_count <= spec["maxReplicas"]


def test_gateway_pods_are_scraped_on_their_metrics_port():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    template = docs[("Deployment", "boundserve-gateway")]["spec"]["template"]
    (gateway,) = template["spec"]["containers"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == module_and_flags(gateway["command"])[1]["--port"]
    assert annotations["prometheus.io/path"] == "/metrics"


def kustomize_version() -> tuple[int, ...] | None:
    if KUBECTL is None:
        return None
    try:
        out = subprocess.run([KUBECTL, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Kustomize Version: v(\d+)\.(\d+)", out)
    return tuple(map(int, found.groups())) if found else None


needs_kubectl = pytest.mark.skipif(
    (kustomize_version() or (0,)) < (5, 0),
    reason="no kubectl with kustomize v5+ on PATH (Debian's kubernetes-client 1.20 has v2): "
           "tests/deploy/kustomize.py renders alone")


def kubectl_kustomize(folder: Path) -> dict[tuple[str, str], dict]:
    result = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return {(b["kind"], b["metadata"]["name"]): b for b in yaml.safe_load_all(result.stdout) if b}


@needs_kubectl
@pytest.mark.parametrize("folder", [str(f.relative_to(ROOT)) for f in kustomization_folders(ROOT)])
def test_the_rendering_is_kubectl_kustomizes(folder):
    assert objects(ROOT / folder) == kubectl_kustomize(ROOT / folder)


@needs_kubectl
def test_generated_names_are_kubectl_kustomizes_for_tricky_contents(tmp_path):
    (tmp_path / "a.toml").write_text('name = "<a&b>"\n# caf\u00e9 \u2028 tab\there\n\n')
    (tmp_path / "b.toml").write_text("x = [1, 2]\n")
    (tmp_path / "kustomization.yaml").write_text(
        "configMapGenerator:\n  - {name: one, files: [a.toml]}\n  - {name: two, files: [b.toml, c.toml=a.toml]}\n")
    assert objects(tmp_path) == kubectl_kustomize(tmp_path)
