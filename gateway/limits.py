"""What a request may ask for: the compiled bounds, the vocabulary and the gateway's own limits."""

from __future__ import annotations

from dataclasses import dataclass

from shared.bounds import Bounds
from shared.config import DeploymentConfig
from shared.manifest import Manifest
from shared.prefix import SharingRule
from shared.work import StaticPrefix


@dataclass(frozen=True)
class Limits:
    """Request limits: the manifest's compiled `bounds` and the gateway config's own."""

    vocab_size: int
    bounds: Bounds
    """What the packages were compiled for (shared/bounds.py checks requests against them)."""
    max_samples_per_request: int
    sharing: SharingRule
    """When samples share their common prefix ([score] min_shared_prefix_tokens, bounds.max_prefix_tokens)."""
    static_prefix: StaticPrefix
    """The score node's static prefix (the manifest's nodes.score.static_prefix_ids; empty: none)."""
    max_deadline_ms: int
    score_enabled: bool
    beam_enabled: bool
    has_head: bool
    prompt_template: str | None
    constraints: str | None
    min_priority: int = 0
    max_priority: int = 0
    """The priorities a request may give ([gateway] min_priority, max_priority)."""

    @classmethod
    def of(cls, config: DeploymentConfig, manifest: Manifest, vocab_size: int) -> Limits:
        """Bounds come from the manifest (what the packages accept: the only bounds at run time; a
        manifest that records none is refused), the rest from config."""
        bounds = compiled_bounds(manifest)
        score = manifest.node_table().score
        return cls(
            vocab_size=vocab_size,
            bounds=bounds,
            max_samples_per_request=config.gateway.max_samples_per_request,
            sharing=SharingRule(config.score.min_shared_prefix_tokens, bounds.limit("max_prefix_tokens")),
            static_prefix=StaticPrefix(score.static_prefix_ids if score is not None else ()),
            max_deadline_ms=config.gateway.max_deadline_ms,
            score_enabled=config.score.enabled and manifest.serves("score"),
            beam_enabled=config.beam.enabled and manifest.serves("beam"),
            has_head=config.score.mlp_head is not None,
            prompt_template=config.score.prompt_template,
            constraints=config.beam.constraints,
            min_priority=config.gateway.min_priority,
            max_priority=config.gateway.max_priority,
        )

    def limit(self, name: str) -> int:
        """A compiled bound (a Bounds field) or a gateway limit, by name (the Limits on gateway/api's
        request fields name them)."""
        return self.bounds.limit(name) if hasattr(self.bounds, name) else getattr(self, name)


def compiled_bounds(manifest: Manifest) -> Bounds:
    """The bounds the packages were compiled for; ValueError when the manifest records none (a
    hand-written one): the config's [bounds] never stand in for them."""
    if manifest.bounds is None:
        raise ValueError("the artifacts' manifest records no bounds, and at run time the compiled bounds are "
                         "the only ones: rebuild the artifacts (python -m compile)")
    return manifest.bounds
