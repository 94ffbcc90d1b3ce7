"""The gateway's latency predictions: each worker's fitted model, corrected online.

The correction itself lives in shared/latency_correction.py, so that the simulator predicts with
the very same code (gateway/worker_link.py feeds it every answered batch).
"""

from __future__ import annotations

from shared.latency_correction import CorrectedModel

__all__ = ["CorrectedModel"]
