"""The last fitted latency profile of an artifacts build on this machine, kept for a fast restart.

A worker that finds a profile for its build key, device and thread count starts serving with it
after a short warm-up instead of timing the whole grid first (seconds on a CPU); it then refits in
the background and rewrites the file. The file lives in a cache folder, not beside the artifacts,
which are often mounted read-only. Any problem reading or writing it only costs the fast path.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from shared.latency_model import LatencyModel
from shared.manifest import Manifest
from worker.profiler import Profile

FORMAT_VERSION = 1


def default_folder(environ: dict[str, str]) -> Path:
    """$XDG_CACHE_HOME/boundserve/profiles, else ~/.cache/boundserve/profiles."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "boundserve" / "profiles"


def cache_path(folder: Path, manifest: Manifest, device: str, threads: int) -> Path:
    """One file per (build, device, intra-op threads): any of them changes the timings."""
    key = json.dumps({"build": manifest.build_key, "device": device, "threads": threads}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return folder / f"{manifest.name or 'artifacts'}-{digest}.json"


def load(path: Path, workloads: tuple[str, ...]) -> dict[str, Profile]:
    """The cached profiles of `workloads`; raises ValueError or OSError when unusable."""
    data = json.loads(path.read_text())
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format {data.get('format_version')!r}, expected {FORMAT_VERSION}")
    profiles = {}
    for workload in workloads:
        entry = data["profiles"].get(workload)
        if entry is None:
            raise ValueError(f"{path}: no profile for {workload}")
        samples = tuple(tuple(float(v) for v in point) for point in entry["samples"])
        profiles[workload] = Profile(LatencyModel(**entry["model"]), float(entry["rmse_ms"]), samples)
    return profiles


def save(path: Path, profiles: dict[str, Profile]) -> None:
    """Write atomically (a reader never sees half a file); raises OSError when the folder is unwritable."""
    data = {"format_version": FORMAT_VERSION,
            "profiles": {w: {"model": p.model.to_dict(), "rmse_ms": p.rmse_ms, "samples": [list(s) for s in p.samples]}
                         for w, p in profiles.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)
