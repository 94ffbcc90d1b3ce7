"""Compute lanes: where one in-flight batch runs (device, CUDA stream, preallocated host buffers).

CPU: one lane; batches run one at a time on the configured intra-op threads.
CUDA: one lane per configured stream, each driven by its own thread. A lane stages token ids in
its own pinned host buffer, so the host-to-device copy is asynchronous on the lane's stream and
overlaps the compute of other lanes' batches. A lane reuses its buffer only after its previous
batch has been synchronised (finish()), so no copy can read a buffer being rewritten.

All lanes of a worker take turns for the node call itself (`turn`): an AOTInductor package runs one
call at a time and waits for a second one while holding the GIL, and its calls into the Python
custom operators (compile/ops.py) need the GIL, so two threads calling at once deadlock. The turn
is held only while the call is issued; a CUDA lane synchronises its stream after releasing it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from shared.config import WorkerConfig


class Lane:
    """One in-flight batch slot: a device, an optional CUDA stream, and a token staging buffer."""

    def __init__(self, device: str, max_tokens: int, stream: torch.cuda.Stream | None = None,
                 turn: threading.Lock | None = None) -> None:
        self.device = device
        self.stream = stream
        self.turn = turn or threading.Lock()  # shared by every lane calling the same packages
        pin = stream is not None
        self.token_buffer = torch.empty(max_tokens, dtype=torch.int64, pin_memory=pin)  # [T_max]

    def stage_tokens(self, parts: Sequence[np.ndarray]) -> torch.Tensor:
        """Concatenate token id arrays into the staging buffer; returns the int64 view [T]."""
        total = sum(len(p) for p in parts)
        if total > len(self.token_buffer):
            raise ValueError(f"{total} tokens exceed the lane buffer of {len(self.token_buffer)}")
        out = self.token_buffer[:total]  # [T]
        if total:
            np.concatenate(parts, out=out.numpy(), casting="same_kind")
        return out

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Make the lane's stream current for the node call, and wait for it before returning."""
        if self.stream is None:
            with self.turn:
                yield
            return
        try:
            with torch.cuda.stream(self.stream), self.turn:
                yield
        finally:  # also after a failure: the staging buffer may be rewritten only once the stream is idle
            self.stream.synchronize()


def max_staged_tokens(bounds: Mapping[str, int]) -> int:
    """Largest number of token ids any batch within bounds stages at once."""
    beam = bounds["max_prompt_tokens"] * bounds["max_beam_requests_per_batch"]
    return max(bounds["max_tokens_per_batch"], beam)


def make_lanes(device: str, config: WorkerConfig, bounds: Mapping[str, int]) -> list[Lane]:
    """The lanes of one worker: one CPU lane, or config.num_streams CUDA lanes."""
    max_tokens = max_staged_tokens(bounds)
    if device == "cpu":
        torch.set_num_threads(config.cpu_threads)
        return [Lane(device, max_tokens)]
    index = torch.device(device).index or 0
    streams = [torch.cuda.Stream(device=index) for _ in range(config.num_streams)]
    turn = threading.Lock()
    return [Lane(device, max_tokens, stream=s, turn=turn) for s in streams]


def spare_lane(sibling: Lane, bounds: Mapping[str, int]) -> Lane:
    """A lane of its own for work beside the served batches (the background profile refit): its own
    staging buffer (and stream), taking turns with `sibling`'s lanes for the node call."""
    stream = None if sibling.stream is None else torch.cuda.Stream(device=sibling.stream.device)
    return Lane(sibling.device, max_staged_tokens(bounds), stream=stream, turn=sibling.turn)
