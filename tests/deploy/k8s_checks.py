"""Everything that must hold of deploy/k8s, as one list of problems, for the real tree or a broken copy.

Every YAML file under deploy/k8s is listed by the kustomization.yaml of its folder; no ConfigMap is
written by hand (configs/kustomization.yaml generates it from configs/k8s.toml); each kustomization
folder renders (tests/deploy/kustomize.py), and every object it renders validates strictly
(tests/deploy/k8s_schemas.py), every ConfigMap a pod spec names is one the rendering holds, and each
container's `--config /app/configs/X` is a key of the ConfigMap mounted at /app/configs.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.k8s_schemas import schema_errors
from tests.deploy.kustomize import KUSTOMIZATION, KustomizeError, Resource, config_map_references, render
from tests.deploy.stack import CONFIGS_IN_CONTAINER, module_and_flags


def k8s_dir(root: Path) -> Path:
    return root / "deploy" / "k8s"


def kustomization_folders(root: Path) -> list[Path]:
    """Every folder under deploy/k8s with a kustomization.yaml (each one a way to deploy)."""
    return sorted(path.parent for path in k8s_dir(root).rglob(KUSTOMIZATION))


def problems(root: Path) -> list[str]:
    """What is wrong with the manifests of the repository tree at `root`; [] when nothing is."""
    root = root.resolve()
    found = _listing_problems(root)
    for folder in kustomization_folders(root):
        where = folder.relative_to(root)
        try:
            resources = render(folder)
        except (KustomizeError, yaml.YAMLError) as error:
            found.append(f"{where}: does not render: {error}")
            continue
        found += [f"{where}: {problem}" for problem in rendering_problems(root, resources)]
    return found


def rendering_problems(root: Path, resources: list[Resource]) -> list[str]:
    """Schema errors and unresolved ConfigMap references among the objects of one rendering."""
    found = []
    config_maps = {r.body["metadata"]["name"]: r.body for r in resources if r.body.get("kind") == "ConfigMap"}
    for resource in resources:
        label = f"{resource.source.relative_to(root)} {resource.kind_name[0]}/{resource.kind_name[1]}"
        found += [f"{label}: {error}" for error in schema_errors(resource.body)]
        for reference in config_map_references(resource.body):
            if reference.get("name") not in config_maps:
                found.append(f"{label}: names ConfigMap {reference.get('name')!r}, not in the rendering "
                             f"(it has {sorted(config_maps)})")
        found += [f"{label}: {problem}" for problem in _config_flag_problems(resource.body, config_maps)]
    return found


def _listing_problems(root: Path) -> list[str]:
    found = []
    for path in sorted(p for p in k8s_dir(root).rglob("*") if p.suffix in (".yaml", ".yml")):
        if path.name == KUSTOMIZATION:
            continue
        kustomization = path.parent / KUSTOMIZATION
        listed = yaml.safe_load(kustomization.read_text()).get("resources", []) if kustomization.is_file() else []
        if path.name not in listed:
            found.append(f"{path.relative_to(root)}: not a resource of {kustomization.relative_to(root)}")
        for body in yaml.safe_load_all(path.read_text()):
            if body and body.get("kind") == "ConfigMap":
                found.append(f"{path.relative_to(root)}: a hand-written ConfigMap {body['metadata']['name']!r} "
                             "(generate it from configs/ with configMapGenerator)")
    return found


def _config_flag_problems(body: dict, config_maps: dict[str, dict]) -> list[str]:
    """Each container's --config file exists in the ConfigMap mounted at the configs folder."""
    pod = body.get("spec", {}).get("template", {}).get("spec") if body.get("kind") in (
        "Deployment", "StatefulSet", "Job") else None
    if pod is None:
        return []
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = []
    for container in pod.get("containers", []):
        config = module_and_flags(container["command"])[1].get("--config") if container.get("command") else None
        if config is None:
            continue
        folder, _, key = config.rpartition("/")
        mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"].rstrip("/") == folder]
        if folder + "/" != CONFIGS_IN_CONTAINER or len(mounts) != 1:
            found.append(f"container {container['name']}: --config {config} is not in one volume "
                         f"mounted at {CONFIGS_IN_CONTAINER}")
            continue
        source = volumes.get(mounts[0]["name"], {}).get("configMap", {}).get("name")
        if key not in config_maps.get(source, {}).get("data", {}):
            found.append(f"container {container['name']}: --config {config}, but ConfigMap {source!r} "
                         f"mounted at {folder} has no key {key!r}")
    return found
