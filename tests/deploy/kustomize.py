"""A kustomization rendered the way `kubectl kustomize` renders it, for the part of kustomize we use.

kustomize cannot be installed from this project's package sources (Debian has no kustomize package;
its kubernetes-client 1.20 embeds a kustomize too old for `labels`; PyPI's `kustomize` is an
unrelated project), so the manifest tests render deploy/k8s themselves: `resources` (files and
kustomization folders), `configMapGenerator` from `files` (name suffixed with kustomize's content
hash, references in pod specs rewritten to it), `labels` and inline JSON6902 `patches`. Any other
field is an error, never skipped, so a kustomization that uses more cannot pass unrendered; the same
goes for kustomize's own refusals that matter here (a file outside the kustomization's folder, a
folder that contains one already visited). Where `kubectl` is on PATH, tests/deploy/
test_k8s_manifests.py asserts this rendering equals `kubectl kustomize`'s, object for object.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

KUSTOMIZATION = "kustomization.yaml"
_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "labels", "patches"}
_WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class KustomizeError(ValueError):
    """A kustomization kustomize would refuse, or one that uses what this renderer does not render."""


@dataclass(frozen=True)
class Resource:
    """One Kubernetes object of a rendering and the file it came from (a generated one: its kustomization)."""

    source: Path
    body: dict

    @property
    def kind_name(self) -> tuple[str, str]:
        return self.body.get("kind", "?"), self.body.get("metadata", {}).get("name", "?")


def render(folder: Path) -> list[Resource]:
    """Every object `kubectl kustomize folder` prints, generated ConfigMaps and references renamed."""
    resources, renames = _accumulate(folder.resolve(), visited=())
    seen: dict[tuple[str, str], Path] = {}
    for resource in resources:
        if resource.kind_name in seen:
            raise KustomizeError(f"{folder}: {resource.kind_name} twice: in {seen[resource.kind_name]} "
                                 f"and in {resource.source}")
        seen[resource.kind_name] = resource.source
        for holder in config_map_references(resource.body):
            holder["name"] = renames.get(holder["name"], holder["name"])
    return resources


def kustomize_hash(data: dict[str, str]) -> str:
    """kustomize's 10-character content suffix for a ConfigMap with `data` (kustomize/api/hasher).

    sha256 of the JSON of {"data", "kind", "name"} with sorted keys and Go's escaping of <, > and &,
    its first 10 hex digits with 0, 1, 3, a, e swapped for g, h, k, m, t (no vowels, no digits that
    read as letters). The name enters as "": kustomize v5 looks up "metadata/name" as one field
    name and finds nothing, so the suffix depends on the contents only.
    """
    encoded = json.dumps({"data": data, "kind": "ConfigMap", "name": ""}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(char, escaped)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def config_map_references(body: dict) -> Iterator[dict]:
    """Each dict whose "name" names a ConfigMap, in the pod spec of a workload (volumes, env, envFrom)."""
    pod = _pod_spec(body)
    if pod is None:
        return
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            yield volume["configMap"]
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                yield source["configMap"]
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        for env_from in container.get("envFrom", []):
            if "configMapRef" in env_from:
                yield env_from["configMapRef"]
        for env in container.get("env", []):
            if "configMapKeyRef" in env.get("valueFrom", {}):
                yield env["valueFrom"]["configMapKeyRef"]


def _pod_spec(body: dict) -> dict | None:
    if body.get("kind") in _WORKLOAD_KINDS:
        return body.get("spec", {}).get("template", {}).get("spec")
    if body.get("kind") == "CronJob":
        return body.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    if body.get("kind") == "Pod":
        return body.get("spec")
    return None


def _accumulate(folder: Path, visited: tuple[Path, ...]) -> tuple[list[Resource], dict[str, str]]:
    """The objects of one kustomization folder (bases first) and its generated names (original -> hashed)."""
    where = folder / KUSTOMIZATION
    if not where.is_file():
        raise KustomizeError(f"{folder}: no {KUSTOMIZATION}")
    for seen in visited:
        if seen.is_relative_to(folder):
            raise KustomizeError(f"{where}: cycle: {folder} contains {seen}, already being rendered")
    spec = yaml.safe_load(where.read_text()) or {}
    if unknown := sorted(set(spec) - _FIELDS):
        raise KustomizeError(f"{where}: {unknown} not rendered by tests/deploy/kustomize.py (extend it)")
    resources: list[Resource] = []
    renames: dict[str, str] = {}
    for entry in spec.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            more, more_renames = _accumulate(path, visited + (folder,))
            resources += more
            renames |= more_renames
        elif path.is_file():
            _inside(folder, path, where, f"resource {entry!r}")
            resources += [Resource(path, body) for body in yaml.safe_load_all(path.read_text()) if body]
        else:
            raise KustomizeError(f"{where}: resource {entry!r} does not exist")
    for generator in spec.get("configMapGenerator", []):
        resource = _generate_config_map(folder, generator, where)
        renames[generator["name"]] = resource.body["metadata"]["name"]
        resources.append(resource)
    for labels in spec.get("labels", []):
        _add_labels(resources, labels, where)
    for patch in spec.get("patches", []):
        _apply_patch(resources, patch, where)
    return resources, renames


def _inside(folder: Path, path: Path, where: Path, what: str) -> None:
    if not path.resolve().is_relative_to(folder):  # kustomize's default load restrictor
        raise KustomizeError(f"{where}: {what} is outside {folder}; kustomize refuses it (security)")


def _generate_config_map(folder: Path, generator: dict, where: Path) -> Resource:
    if unknown := sorted(set(generator) - {"name", "files"}):
        raise KustomizeError(f"{where}: configMapGenerator fields {unknown} not rendered (extend kustomize.py)")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, relative = entry.rpartition("=") if "=" in entry else (Path(entry).name, "", entry)
        path = folder / relative
        _inside(folder, path, where, f"generator file {entry!r}")
        if not path.is_file():
            raise KustomizeError(f"{where}: generator file {entry!r} does not exist")
        if key in data:
            raise KustomizeError(f"{where}: key {key!r} given twice in configMapGenerator {generator['name']}")
        data[key] = path.read_text()
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{generator['name']}-{kustomize_hash(data)}"}, "data": data}
    return Resource(where, body)


def _add_labels(resources: list[Resource], labels: dict, where: Path) -> None:
    """`labels` without includeSelectors/includeTemplates: metadata.labels of every object only."""
    if set(labels) - {"pairs"}:
        raise KustomizeError(f"{where}: labels options {sorted(set(labels) - {'pairs'})} not rendered")
    for resource in resources:
        resource.body.setdefault("metadata", {}).setdefault("labels", {}).update(labels["pairs"])


def _apply_patch(resources: list[Resource], patch: dict, where: Path) -> None:
    """An inline JSON6902 patch (a list of add/replace/remove operations) on the objects its target names."""
    target, operations = patch.get("target", {}), yaml.safe_load(patch.get("patch", ""))
    if set(patch) != {"target", "patch"} or not isinstance(operations, list):
        raise KustomizeError(f"{where}: only inline JSON6902 patches with a target are rendered: {patch}")
    matched = [r for r in resources if _matches(r.body, target)]
    if not matched:
        raise KustomizeError(f"{where}: patch target {target} matches no object")
    for resource in matched:
        for operation in operations:
            _apply_operation(resource.body, operation, where)


def _matches(body: dict, target: dict) -> bool:
    group, _, version = body.get("apiVersion", "").rpartition("/")
    have = {"group": group, "version": version, "kind": body.get("kind"), "name": body["metadata"]["name"]}
    if unknown := set(target) - set(have):
        raise KustomizeError(f"patch target fields {sorted(unknown)} not rendered")
    return all(have[field] == value for field, value in target.items())


def _apply_operation(body: dict, operation: dict, where: Path) -> None:
    op, path, name = operation.get("op"), operation.get("path", ""), body["metadata"]["name"]
    if op not in ("add", "replace", "remove"):
        raise KustomizeError(f"{where}: patch op {op!r} not rendered (add, replace, remove)")
    *walk, last = [key.replace("~1", "/").replace("~0", "~") for key in path.split("/")[1:]]
    parent = body
    try:
        for key in walk:
            parent = parent[int(key) if isinstance(parent, list) else key]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op == "add":
                parent.insert(index, copy.deepcopy(operation["value"]))
            elif op == "replace":
                parent[index] = copy.deepcopy(operation["value"])
            else:
                del parent[index]
        elif op == "remove":
            del parent[last]
        else:
            if op == "replace" and last not in parent:  # JSON6902: replace needs the member to exist
                raise KeyError(last)
            parent[last] = copy.deepcopy(operation["value"])
    except (KeyError, IndexError, ValueError, TypeError):
        raise KustomizeError(f"{where}: patch {op} {path}: no such member in {name}") from None
