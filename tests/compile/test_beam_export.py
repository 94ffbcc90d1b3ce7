"""The beam node exports for deployments whose bounds are smaller than the tracing example."""

import pytest
import torch

from compile.beam.module import BeamModule, export_beam_node
from compile.beam.generation_config import beam_rule, read_generation_config
from compile.checkpoint import load_checkpoint
from compile.model import build_model


@pytest.mark.parametrize("max_prompt_tokens,max_requests,max_beams", [(4, 1, 2), (64, 2, 8)])
def test_small_bounds_export(demo_checkpoint, max_prompt_tokens, max_requests, max_beams):
    checkpoint = load_checkpoint(demo_checkpoint)
    model = build_model(checkpoint.spec, checkpoint.state_dict, torch.float32)
    rule = beam_rule(read_generation_config(demo_checkpoint), source="generation_config.json")
    program = export_beam_node(BeamModule(model, rule, max_steps=2), max_prompt_tokens, max_requests, max_beams)
    assert len(program.graph_signature.user_inputs) == 8
