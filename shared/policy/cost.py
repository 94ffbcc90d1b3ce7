"""What the policy reads of a worker's latency prediction (shared/latency_correction.py's CorrectedModel)."""

from __future__ import annotations

from typing import Protocol


class CostModel(Protocol):
    """A worker's latency prediction (shared/latency_correction.py's CorrectedModel)."""

    @property
    def verified(self) -> bool: ...

    overhead_ms: float
    """What a batch's round trip takes beyond its compute (part of every prediction)."""

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float: ...

    def backlog_ms(self, items: int, tokens: int) -> float: ...
