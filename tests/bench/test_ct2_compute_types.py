"""CTranslate2 as a peer below float32: every compute type it offers is swept, and the fastest one that passes the
quantized bound (the bound our int8 node is held to) is the one compared with."""

import torch

from bench.harness.ct2_baseline import CPU_COMPUTE_TYPES, sweep_types
from bench.score_node import fastest_at_parity

EVERY = {"float32", "int8", "int8_float32", "int8_bfloat16", "int16", "bfloat16"}


def test_a_run_below_float32_sweeps_every_compute_type_offered():
    assert set(CPU_COMPUTE_TYPES) == EVERY
    assert set(sweep_types(EVERY, below_float32=True)) == EVERY
    assert sweep_types(EVERY - {"int8_bfloat16", "bfloat16"}, True) == ("int8_float32", "int8", "int16", "float32")
    assert sweep_types(EVERY, below_float32=False) == ("float32",)


def outputs(reference: torch.Tensor, misses: dict[str, float]) -> dict:
    """Each type's (top-1 ids [B], log-probs [B]): the reference's own top-1, its log-prob off by `misses[type]`."""
    ids = reference.argmax(-1)
    logprobs = torch.log_softmax(reference, -1).gather(1, ids[:, None])[:, 0]
    return {t: (ids, logprobs - miss) for t, miss in misses.items()}


def test_the_fastest_compute_type_within_the_quantized_bound_is_taken():
    reference = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    misses = {"int8": 1.5, "int8_bfloat16": 0.2, "int16": 0.05, "bfloat16": 0.1, "int8_float32": 0.3, "float32": 0.0}
    report = {"ct2_compute_type_ms": {"int8": 10.0, "int8_bfloat16": 12.0, "int16": 30.0, "bfloat16": 15.0,
                                      "int8_float32": 14.0, "float32": 40.0}}
    assert fastest_at_parity(report, outputs(reference, misses), reference) == "int8_bfloat16"
    assert list(report["ct2_compute_types_refused"]) == ["int8"]
    assert report["ct2_compute_types_refused"]["int8"]["tolerance"] == 1.0
