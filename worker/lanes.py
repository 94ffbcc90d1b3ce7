"""Compute lanes: where one in-flight batch runs (device, CUDA stream, staging buffers, turn).

CPU: one lane; batches run one at a time on config.cpu_threads intra-op threads (the thread count
the packages are compiled for). A build's packages run through worker/runtime/package_runner.py, whose
calls release the GIL, so two lanes of one thread each do compute at once; measured against one lane on
both threads (bench/cpu_lanes.py), they served about as many requests per second at about twice the
latency each, so a CPU worker keeps one lane.
CUDA: one lane per configured stream, each driven by its own thread. All CUDA lanes share one turn,
held only while a call is enqueued on the lane's stream (layout, pinned input copies, the package
call, the output copies into pinned buffers with an event), never while waiting for the device:
the wait (Pending.result(), worker/runtime/transfer.py) happens after the turn is released, so one lane's
batch computes while another lane enqueues. A lane's staging buffers are reused only after its
previous batch's result() (after a failure: after its stream is synchronised).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from worker.runtime.transfer import Staging
from shared.bounds import Bounds
from shared.config import WorkerConfig


class Lane:
    """One in-flight batch slot: a device, an optional CUDA stream, staging buffers and a turn."""

    def __init__(self, device: str, max_staged_tokens: int, stream: torch.cuda.Stream | None = None,
                 turn: threading.Lock | None = None) -> None:
        self.device = device
        self.stream = stream
        self.turn = turn or threading.Lock()  # shared by the CUDA lanes calling the same packages
        self.staging = Staging(device)  # the node's pinned input/output buffers and event (GPU)
        self.token_buffer = torch.empty(max_staged_tokens, dtype=torch.int64)  # [T_max]

    def stage_tokens(self, parts: Sequence[np.ndarray]) -> torch.Tensor:
        """Concatenate token id arrays into the lane's buffer; returns the int64 view [T]."""
        total = sum(len(p) for p in parts)
        if total > len(self.token_buffer):
            raise ValueError(f"{total} tokens exceed the lane buffer of {len(self.token_buffer)}")
        out = self.token_buffer[:total]  # [T]
        if total:
            np.concatenate(parts, out=out.numpy(), casting="same_kind")
        return out

    @contextlib.contextmanager
    def enqueueing(self) -> Iterator[None]:
        """Hold the turn with the lane's stream current, for the enqueue of one call only."""
        if self.stream is None:
            with self.turn:
                yield
            return
        try:
            with torch.cuda.stream(self.stream), self.turn:
                yield
        except BaseException:
            self.stream.synchronize()  # copies in flight may still read the staging buffers
            raise


def max_staged_tokens(bounds: Bounds) -> int:
    """Largest number of token ids any batch within bounds stages at once."""
    beam = bounds.max_prompt_tokens * bounds.max_beam_requests_per_batch
    return max(bounds.max_tokens_per_batch, beam)


def lane_count(device: str, config: WorkerConfig) -> int:
    """How many batches a worker has in flight at once: one on a CPU, num_streams on a GPU."""
    return 1 if device == "cpu" else config.num_streams


def make_lanes(device: str, config: WorkerConfig, bounds: Bounds) -> list[Lane]:
    """The lanes of one worker: one CPU lane, or config.num_streams CUDA lanes."""
    staged_tokens = max_staged_tokens(bounds)
    if device == "cpu":
        return [Lane(device, staged_tokens)]
    index = torch.device(device).index or 0
    streams = [torch.cuda.Stream(device=index) for _ in range(config.num_streams)]
    turn = threading.Lock()
    return [Lane(device, staged_tokens, stream=s, turn=turn) for s in streams]


def spare_lane(sibling: Lane, bounds: Bounds) -> Lane:
    """A lane of its own for work beside the served batches (the background profile refit): its own
    staging buffers (and stream), taking turns with `sibling`'s lane for the node call."""
    stream = None if sibling.stream is None else torch.cuda.Stream(device=sibling.stream.device)
    return Lane(sibling.device, max_staged_tokens(bounds), stream=stream, turn=sibling.turn)
