"""What a request may ask for: the compiled bounds, the vocabulary and the gateway's own limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.config import DeploymentConfig


@dataclass(frozen=True)
class Limits:
    """Request limits, from the manifest's bounds (what was compiled) and the gateway config."""

    vocab_size: int
    max_samples_per_request: int
    max_samples_per_batch: int
    max_tokens_per_sample: int
    max_tokens_per_batch: int
    """Tokens sent per batch (a shared prefix once)."""
    max_prefix_tokens: int
    """Longest shared prefix one request may send; a longer common prefix goes unshared."""
    min_shared_prefix_tokens: int
    """Shortest common prefix worth sending shared ([score] min_shared_prefix_tokens)."""
    static_prefix_ids: tuple[int, ...]
    """The score node's static prefix (the manifest's nodes.score.static_prefix_ids; empty: none)."""
    max_labels: int
    max_top_k: int
    max_prompt_tokens: int
    max_beam_width: int
    max_new_tokens: int
    max_beam_requests_per_batch: int
    max_deadline_ms: int
    score_enabled: bool
    beam_enabled: bool
    has_head: bool
    prompt_template: str | None
    constraints: str | None

    @classmethod
    def from_manifest(cls, config: DeploymentConfig, manifest: dict[str, Any], vocab_size: int) -> Limits:
        """Bounds come from the manifest (what the packages accept), the rest from config."""
        bounds = {**config.bounds.resolved(), **manifest.get("bounds", {})}
        nodes = manifest.get("nodes", {})
        return cls(
            vocab_size=int(vocab_size),
            max_samples_per_request=config.gateway.max_samples_per_request,
            max_samples_per_batch=int(bounds["max_samples_per_batch"]),
            max_tokens_per_sample=int(bounds["max_tokens_per_sample"]),
            max_tokens_per_batch=int(bounds["max_tokens_per_batch"]),
            max_prefix_tokens=min(int(bounds["max_prefix_tokens"]), int(bounds["max_tokens_per_sample"])),
            min_shared_prefix_tokens=config.score.min_shared_prefix_tokens,
            static_prefix_ids=tuple(int(t) for t in nodes.get("score", {}).get("static_prefix_ids", ())),
            max_labels=int(bounds["max_labels"]),
            max_top_k=int(bounds["max_top_k"]),
            max_prompt_tokens=int(bounds["max_prompt_tokens"]),
            max_beam_width=int(bounds["max_beam_width"]),
            max_new_tokens=int(bounds["max_new_tokens"]),
            max_beam_requests_per_batch=int(bounds["max_beam_requests_per_batch"]),
            max_deadline_ms=config.gateway.max_deadline_ms,
            score_enabled=config.score.enabled and (not nodes or "score" in nodes),
            beam_enabled=config.beam.enabled and (not nodes or "beam" in nodes),
            has_head=config.score.mlp_head is not None,
            prompt_template=config.score.prompt_template,
            constraints=config.beam.constraints,
        )
