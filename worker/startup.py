"""Builds a ready-to-run WorkerServer: load artifacts, allocate lanes, warm up, profile, make Ready.

Fast restart: when the profile cache (worker/profile_cache.py) holds a profile of this build on this
device, the worker warms up only the first call of each node and serves with that profile at once;
it refits in the background (worker/refit.py). Without one it times the grid before serving and
saves the result for the next start.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import torch

from worker.runtime.allocator import keep_freed_memory
from worker.runtime.artifacts import read_manifest
from worker.runtime.machine import ArtifactMismatch
from worker.runtime.loader import load_nodes
from shared.bounds import Bounds
from shared.config import DeploymentConfig, WorkerConfig
from shared.events import Profiled, ProfileReused
from shared.manifest import Manifest, bounds_differences, threads_difference
from shared.protocol import PROTOCOL_VERSION, Ready
from shared.catalog import DEFAULT_CATALOG
from worker.catalog_store import CatalogStore
from worker.compute import ComputePool
from worker import profile_cache
from worker.lanes import lane_count, make_lanes, spare_lane
from worker.logs import JsonLog
from worker.memory import MIB, ResidentLimit, resident_limit
from worker.prefix_cache import PrefixCache
from worker.profiler import Plan, Profile, plan_batches, profile_plans, warm_up_smallest
from worker.refit import BackgroundRefit
from worker.runner import BeamRunner, ScoreRunner
from worker.server import WorkerServer
from worker.workloads import workloads_of

MODEL_FACTS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
               "intermediate_size", "max_position_embeddings")


def build_server(config: DeploymentConfig, artifacts: str | Path, device: str, endpoint: str,
                 worker_id: str, log: JsonLog, profile_folder: Path | None = None) -> WorkerServer:
    """Everything a worker does before serving; refuses artifacts built for another machine.
    `profile_folder`: where the last fitted profile is kept (None: always profile before serving)."""
    built = read_manifest(Path(artifacts))
    if device == "cpu" and (problem := threads_difference(built, config)):
        raise ArtifactMismatch(problem)
    if differences := bounds_differences(built, config):  # the compiled bounds are the only ones at run time
        raise ArtifactMismatch(f"the config's [bounds] differ from what {artifacts} was compiled for: "
                               f"{'; '.join(differences)}; rebuild, or leave [bounds] out of the config")
    if device == "cpu":
        torch.set_num_threads(config.worker.cpu_threads)  # every lane's calls run on this many
        if not keep_freed_memory():  # else every call faults its buffers in again (worker/runtime/allocator.py)
            log.warning("allocator_default", reason="this C library has no mallopt: calls fault fresh memory in")
    # a runner per lane and one for the background refit's spare lane: they call at once
    nodes = load_nodes(artifacts, device, runners=lane_count(device, config.worker) + 1)  # ArtifactMismatch
    manifest = nodes.manifest
    compiled = manifest.bounds
    vocab_size = manifest.model.vocab_size
    lanes = make_lanes(device, config.worker, compiled)
    cache_mb = config.score.prefix_cache_mb
    if cache_mb and nodes.score is not None and not nodes.score.takes_hits:
        log.warning("prefix_cache_off", prefix_cache_mb=cache_mb,
                    reason="the score package was built before the prefix cache (no hit inputs): rebuild it to cache")
        cache_mb = 0
    prefix_cache = PrefixCache(cache_mb << 20, bytes.fromhex(manifest.build_key))  # budget 0: off, reported so
    catalogs = load_catalogs(manifest, config, device, log)
    workloads = workloads_of(ScoreRunner(nodes.score, prefix_cache) if nodes.score is not None else None,
                             BeamRunner(nodes.beam, catalogs) if nodes.beam is not None else None, compiled, vocab_size)
    limit = resident_limit(config.worker.resident_limit_mb) if device == "cpu" else None  # worker/memory.py
    log.info("loaded", artifacts=str(artifacts), device=device, lanes=len(lanes), workloads=list(workloads.names()),
             prefix_cache_mb=cache_mb, resident_limit_mb=limit and limit // MIB)
    plans = plan_batches(workloads, compiled, vocab_size)
    threads = config.worker.cpu_threads if device == "cpu" else len(lanes)
    cache = profile_cache.cache_path(profile_folder, manifest, device, threads) if profile_folder else None
    profiles, refit_factory = _profiles(plans, lanes, compiled, config.worker, cache, log)
    ready = Ready(
        protocol_version=PROTOCOL_VERSION, worker_id=worker_id, device=device, pid=os.getpid(),
        workloads=tuple(profiles), bounds=compiled, model=model_facts(manifest, nodes),
        latency={w: p.model for w, p in profiles.items()},
    )
    resident = ResidentLimit(limit, log) if limit is not None else None
    pool_factory = functools.partial(ComputePool, lanes, workloads, log, resident=resident)
    return WorkerServer(endpoint, config.worker, ready, workloads, pool_factory, log, refit_factory, prefix_cache,
                        catalogs)


def load_catalogs(manifest: Manifest, config: DeploymentConfig, device: str, log: JsonLog) -> CatalogStore | None:
    """The catalogue store of a constrained beam node, `[beam] constraints` loaded as its default catalogue
    (None: an unconstrained node). The node needs a catalogue from its first call (the profile's too)."""
    catalogs = CatalogStore.for_manifest(manifest, device)
    if catalogs is None:
        return None
    if not config.beam.constraints:
        raise ValueError("the beam node was built to decode constrained (beam.max_catalog_nodes = "
                         f"{catalogs.bounds.max_nodes}): set beam.constraints to the catalogue to load at start")
    summary = catalogs.update({DEFAULT_CATALOG: config.beam.constraints})  # ValueError names the file or bound
    log.info("catalog_loaded", version=summary.version, items=summary.items, nodes=summary.nodes,
             max_nodes=summary.max_nodes, load_s=round(summary.load_s, 3))
    return catalogs


def _profiles(plans: dict[str, Plan], lanes: list, bounds: Bounds, config: WorkerConfig, cache: Path | None,
              log: JsonLog) -> tuple[dict[str, Profile], Callable | None]:
    """(profiles, refit factory): the cached profiles after a short warm-up, refitted later in the
    background; else the grid timed now (and saved), with nothing to refit."""
    profiles = _cached_profiles(cache, plans, log)
    if profiles is not None:
        warm_up_smallest(plans, lanes[0], max(1, config.warmup_runs))
        return profiles, functools.partial(_make_refit, plans, profiles, spare_lane(lanes[0], bounds), config, cache,
                                           log)
    profiles = profile_plans(plans, lanes[0], config)
    for workload, profile in profiles.items():
        log.emit(Profiled(workload=workload, points=len(profile.samples), rmse_ms=round(profile.rmse_ms, 4),
                          **profile.model.to_dict()))
    _save_profiles(cache, profiles, log)
    return profiles, None


def _cached_profiles(cache: Path | None, plans: dict[str, Plan], log: JsonLog) -> dict[str, Profile] | None:
    if cache is None or not cache.exists():
        return None
    try:
        profiles = profile_cache.load(cache, tuple(plans))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("profile_cache_unusable", path=str(cache), error=f"{type(exc).__name__}: {exc}")
        return None
    for workload, profile in profiles.items():
        log.emit(ProfileReused(workload=workload, path=str(cache), points=len(profile.samples),
                               rmse_ms=round(profile.rmse_ms, 4), **profile.model.to_dict()))
    return profiles


def _save_profiles(cache: Path | None, profiles: dict[str, Profile], log: JsonLog) -> None:
    if cache is None:
        return
    try:
        profile_cache.save(cache, profiles)
    except OSError as exc:  # a read-only home costs the next start its fast path, nothing else
        log.warning("profile_cache_unwritable", path=str(cache), error=str(exc))


def _make_refit(plans, cached, lane, config, cache, log, server: WorkerServer) -> BackgroundRefit:
    def publish(profiles: dict[str, Profile]) -> None:
        _save_profiles(cache, profiles, log)
        server.publish_latency({w: p.model for w, p in profiles.items()})

    return BackgroundRefit(plans, cached, lane, config.profile_repeats, config.profile_budget_s, server.activity,
                           publish, log)


def model_facts(manifest: Manifest, nodes) -> dict:
    """The scalar model facts a gateway may need (sizes, dtype, head width)."""
    facts = {k: getattr(manifest.model, k) for k in MODEL_FACTS}
    facts["name"] = manifest.name
    facts["dtype"] = manifest.dtype
    facts["has_head"] = bool(nodes.score is not None and nodes.score.has_head)
    return {k: v for k, v in facts.items() if isinstance(v, (int, float, str, bool))}
