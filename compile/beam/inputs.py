"""What the beam node is built with besides the model, read and checked before any build work."""

from __future__ import annotations

import json
from dataclasses import dataclass

from compile.beam.generation_config import beam_rule, read_generation_config
from compile.beam.search import BeamRule
from shared.catalog import DEFAULT_CATALOG, CatalogBounds, CatalogTooLarge, load_catalog
from shared.config import DeploymentConfig


@dataclass(frozen=True)
class BeamInputs:
    """What the beam node is built with besides the model: the checkpoint's generation rule and the
    catalogue table sizes (None: unconstrained; `[beam] max_catalog_nodes` and `max_catalog_fanout`)."""

    rule: BeamRule
    catalog: CatalogBounds | None


def read_inputs(config: DeploymentConfig, vocab_size: int) -> BeamInputs:
    """Read and validate the beam node's inputs. The build calls it before any work (compile/build.py's
    check_inputs), so a bad generation_config.json, or a `[beam] constraints` catalogue (the one the
    worker loads at start) that does not fit the table bounds, is refused before the checkpoint loads
    and the score node compiles; the node builder gets what it read (BuildContext.beam)."""
    bounds, path, beam = config.build_bounds, config.model.path, config.beam
    source = f"{path}/generation_config.json"
    try:
        rule = beam_rule(read_generation_config(path), source=source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON: {exc}") from None
    if rule.beams_to_keep(bounds.max_beam_width) > vocab_size:
        raise ValueError(
            f"bounds.max_beam_width = {bounds.max_beam_width} keeps {rule.beams_to_keep(bounds.max_beam_width)} "
            f"candidates per step, more than the vocabulary ({vocab_size}); lower max_beam_width"
        )
    if not beam.max_catalog_nodes:
        return BeamInputs(rule, None)
    catalog = CatalogBounds(beam.max_catalog_nodes, beam.max_catalog_fanout)
    if beam.constraints:
        try:
            trie = load_catalog(beam.constraints, vocab_size, bounds.max_new_tokens)
        except (ValueError, OSError) as exc:
            raise ValueError(f"beam.constraints {exc}") from None
        try:
            catalog.check({DEFAULT_CATALOG: trie})
        except CatalogTooLarge as exc:
            raise ValueError(f"beam.constraints = {beam.constraints!r}: {exc}") from None
    return BeamInputs(rule, catalog)
