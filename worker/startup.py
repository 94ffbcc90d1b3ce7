"""Builds a ready-to-run WorkerServer: load artifacts, allocate lanes, warm up, profile, make Ready."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from compile.runtime import load_nodes
from shared.config import DeploymentConfig
from shared.protocol import PROTOCOL_VERSION, BeamBatch, Ready, ScoreBatch
from worker.bounds_check import check_beam_batch, check_score_batch
from worker.compute import ComputePool
from worker.lanes import make_lanes
from worker.logs import JsonLog
from worker.profiler import profile_all
from worker.runner import BeamRunner, ScoreRunner
from worker.server import WorkerServer

MODEL_FACTS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
               "intermediate_size", "max_position_embeddings")


def build_server(config: DeploymentConfig, artifacts: str | Path, device: str, endpoint: str,
                 worker_id: str, log: JsonLog) -> WorkerServer:
    """Everything a worker does before serving; refuses artifacts built for another machine."""
    nodes = load_nodes(artifacts, device)  # raises ArtifactMismatch for another machine
    manifest = nodes.manifest
    bounds = manifest["bounds"]
    vocab_size = manifest["model"]["vocab_size"]
    lanes = make_lanes(device, config.worker, bounds)
    runners, checks = {}, {}
    static_ids = static_prefix_ids(manifest)
    if nodes.score is not None:
        runners[ScoreBatch] = ScoreRunner(nodes.score)
        checks[ScoreBatch] = functools.partial(check_score_batch, bounds=bounds, vocab_size=vocab_size)
    if nodes.beam is not None:
        runners[BeamBatch] = BeamRunner(nodes.beam)
        checks[BeamBatch] = functools.partial(check_beam_batch, bounds=bounds, vocab_size=vocab_size)
    log.info("loaded", artifacts=str(artifacts), device=device, lanes=len(lanes),
             workloads=[t.__name__ for t in runners])
    profiles = profile_all(runners, lanes[0], bounds, vocab_size, config.worker)
    for workload, profile in profiles.items():
        log.info("profiled", workload=workload, points=len(profile.samples), rmse_ms=round(profile.rmse_ms, 4),
                 **profile.model.to_dict())
    ready = Ready(
        protocol_version=PROTOCOL_VERSION, worker_id=worker_id, device=device, pid=os.getpid(),
        workloads=tuple(profiles), bounds={k: int(v) for k, v in bounds.items()},
        model=model_facts(manifest, nodes),
        latency={w: p.model for w, p in profiles.items()},
        latency_rmse_ms={w: p.rmse_ms for w, p in profiles.items()},
        max_queued_batches=config.worker.max_queued_batches, num_streams=len(lanes),
        heartbeat_interval_ms=config.worker.heartbeat_interval_ms, static_prefix_ids=static_ids,
    )
    pool_factory = functools.partial(_make_pool, lanes, runners, log)
    return WorkerServer(endpoint, config.worker, ready, checks, pool_factory, log)


def static_prefix_ids(manifest: dict) -> tuple[int, ...]:
    """The score node's static prefix (manifest nodes.score.static_prefix_ids; missing = none)."""
    return tuple(int(t) for t in manifest.get("nodes", {}).get("score", {}).get("static_prefix_ids", ()))


def model_facts(manifest: dict, nodes) -> dict:
    """The scalar model facts a gateway may need (sizes, dtype, head width)."""
    facts = {k: manifest["model"][k] for k in MODEL_FACTS if k in manifest["model"]}
    facts["name"] = manifest.get("name", "")
    facts["dtype"] = manifest.get("dtype", "")
    facts["has_head"] = bool(nodes.score is not None and nodes.score.has_head)
    return {k: v for k, v in facts.items() if isinstance(v, (int, float, str, bool))}


def _make_pool(lanes, runners, log, queue, stats, context, outbox) -> ComputePool:
    return ComputePool(lanes, runners, queue, stats, log, context, outbox)
