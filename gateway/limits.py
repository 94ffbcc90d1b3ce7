"""What a request may ask for: the compiled bounds, the vocabulary and the gateway's own limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.bounds import Bounds
from shared.config import DeploymentConfig


@dataclass(frozen=True)
class Limits:
    """Request limits: the manifest's compiled `bounds` and the gateway config's own."""

    vocab_size: int
    bounds: Bounds
    """What the packages were compiled for (shared/bounds.py checks requests against them)."""
    max_samples_per_request: int
    min_shared_prefix_tokens: int
    """Shortest common prefix worth sending shared ([score] min_shared_prefix_tokens)."""
    static_prefix_ids: tuple[int, ...]
    """The score node's static prefix (the manifest's nodes.score.static_prefix_ids; empty: none)."""
    max_deadline_ms: int
    score_enabled: bool
    beam_enabled: bool
    has_head: bool
    prompt_template: str | None
    constraints: str | None

    @classmethod
    def from_manifest(cls, config: DeploymentConfig, manifest: dict[str, Any], vocab_size: int) -> Limits:
        """Bounds come from the manifest (what the packages accept), the rest from config."""
        nodes = manifest.get("nodes", {})
        return cls(
            vocab_size=int(vocab_size),
            bounds=Bounds.from_manifest({**config.bounds.resolved(), **manifest.get("bounds", {})}),
            max_samples_per_request=config.gateway.max_samples_per_request,
            min_shared_prefix_tokens=config.score.min_shared_prefix_tokens,
            static_prefix_ids=tuple(int(t) for t in nodes.get("score", {}).get("static_prefix_ids", ())),
            max_deadline_ms=config.gateway.max_deadline_ms,
            score_enabled=config.score.enabled and (not nodes or "score" in nodes),
            beam_enabled=config.beam.enabled and (not nodes or "beam" in nodes),
            has_head=config.score.mlp_head is not None,
            prompt_template=config.score.prompt_template,
            constraints=config.beam.constraints,
        )

    def limit(self, name: str) -> int:
        """A compiled bound (a Bounds field) or a gateway limit, by name (http_types' fields name them)."""
        return getattr(self.bounds, name) if hasattr(self.bounds, name) else getattr(self, name)
