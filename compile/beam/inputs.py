"""What the beam node compiles in besides the model, read and checked before any build work."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from compile.beam.generation_config import beam_rule, read_generation_config
from compile.beam.processors import build_tables, read_sequences
from compile.beam.search import BeamRule
from shared.config import DeploymentConfig


@dataclass(frozen=True)
class BeamInputs:
    """What the beam node compiles in besides the model: the checkpoint's generation rule and the
    prefix tables of `[beam] constraints` (None without)."""

    rule: BeamRule
    tables: dict[str, torch.Tensor] | None
    valid_sequences: int


def read_inputs(config: DeploymentConfig, vocab_size: int) -> BeamInputs:
    """Read and validate the beam node's inputs. The build calls it before any work (compile/build.py's
    check_inputs), so a bad generation_config.json or constraints file is refused before the checkpoint
    loads and the score node compiles; the node builder gets what it read (BuildContext.beam)."""
    bounds, path = config.build_bounds, config.model.path
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
    if not config.beam.constraints:
        return BeamInputs(rule, None, 0)
    constraints = Path(config.beam.constraints)
    try:
        sequences = read_sequences(constraints)
        tables = build_tables(sequences, vocab_size, bounds.max_new_tokens)
    except (ValueError, OSError) as exc:
        message = str(exc).removeprefix("constraints: ")
        if not message.startswith(f"{constraints}:"):  # read_sequences names the file and line; the others not
            message = f"{constraints}: {message}"
        raise ValueError(f"beam.constraints {message}") from None
    return BeamInputs(rule, tables, len(sequences))
