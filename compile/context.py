"""What every node builder of the build gets (BuildContext) and the builder's signature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from compile.beam.inputs import BeamInputs
from compile.checkpoint import Checkpoint
from compile.model import Transformer
from shared.config import DeploymentConfig


@dataclass(frozen=True)
class BuildContext:
    """What every node builder gets: the deployment, the loaded checkpoint and the model."""

    config: DeploymentConfig
    checkpoint: Checkpoint
    model: Transformer
    dtype: torch.dtype
    device: str
    beam: BeamInputs | None = None
    """The beam node's generation rule and catalogue table sizes, read once by check_inputs (None: beam off)."""


# workload name -> builder returning (module whose state dict holds the node's weights, its export,
# extra manifest facts about the node)
NodeBuilder = Callable[[BuildContext], tuple[torch.nn.Module, torch.export.ExportedProgram, dict]]
