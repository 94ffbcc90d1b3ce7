"""Each peer of a workload at its best setting: the fastest micro-batch (transformers, OpenVINO) or compute type
(CTranslate2) on a slice of the request, a compute type only where its output passes the run's parity bound.

Every setting is timed once on the same slice after one untimed warm-up call of the contender on two of its
samples (which loads a compute type's model, compiles OpenVINO's request and touches the first buffers), so the
first setting swept is not charged for them. Tables are in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness.common import interleaved_round


def fastest(fns: dict) -> tuple[object, dict[str, float], dict]:
    """Time each setting's call once, in order: (the fastest setting, setting -> ms, setting -> its output)."""
    table, outputs = {}, {}
    for key, fn in fns.items():
        (seconds, value), = interleaved_round({key: fn}).values()
        table[key], outputs[key] = 1e3 * seconds, value
    return min(table, key=table.get), {str(k): round(v, 1) for k, v in table.items()}, outputs


def hf_micro_batch(hf, samples: list[torch.Tensor], pad_id: int, sizes: tuple[int, ...]) -> tuple[int, dict]:
    """transformers' fastest micro-batch size on `samples` (full prompts): (size, table)."""
    hf_side.best(hf, samples[:2], pad_id, 2)
    size, table, _ = fastest({m: (lambda m=m: hf_side.best(hf, samples, pad_id, m)) for m in sizes})
    return size, table


def openvino_micro_batch(openvino, precision: str, samples: list[torch.Tensor],
                         sizes: tuple[int, ...]) -> tuple[int, dict]:
    """OpenVINO's fastest micro-batch size at `precision` on `samples` (full prompts): (size, table)."""
    openvino.logits(precision, samples[:2], 2)
    size, table, _ = fastest({m: (lambda m=m: openvino.logits(precision, samples, m)) for m in sizes})
    return size, table


def ct2_compute_type(ct2, types: tuple[str, ...], rows: list[list[str]], static_prompt: list[str] | None,
                     check: Callable[[str, torch.Tensor], dict]) -> tuple[str, dict, dict]:
    """CTranslate2's fastest compute type of `types` whose last-position scores [B, V] on `rows` pass `check(name,
    scores)` (the run's bound): (type, table, type -> its failed check). None passing: the fastest, its failed
    check reported (the run's own parity check then refuses the result)."""
    for compute_type in types:
        ct2.last_logits(compute_type, rows[:2], static_prompt)
    _, table, outputs = fastest({t: (lambda t=t: ct2.last_logits(t, rows, static_prompt)) for t in types})
    checks = {t: check(f"ct2_{t}_sweep", scores) for t, scores in outputs.items()}
    refused = {t: c for t, c in checks.items() if not c["ok"]}
    passing = [t for t in types if t not in refused] or list(types)
    return min(passing, key=lambda t: table[t]), table, refused
