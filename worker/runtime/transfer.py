"""Moving a node call's inputs to the device and its outputs back without a host sync inside the call.

On a GPU: inputs are copied into pinned host buffers (a host memcpy), then to the device with
non_blocking=True on the current stream; outputs are copied into pinned host buffers with
non_blocking=True and an event is recorded after them. `Pending.result()` waits on that event, so the
enqueue (layout, copies, the package call) never waits for the device, and the wait can happen
outside whatever lock serialised the enqueue (worker/lanes.py). On a CPU nothing moves.

One Staging per lane: a lane runs one call at a time, and its buffers are reused only after that
call's result() (or, after a failure, after its stream is synchronised), so no copy in flight ever
reads a buffer being rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class Staging:
    """Pinned host buffers (grown on demand, reused) and one event, for the calls of one lane."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.event = torch.cuda.Event() if self.device.type == "cuda" else None

    def to_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Host tensors -> device tensors, each through its pinned buffer (no copy on a CPU)."""
        if self.device.type == "cpu":
            return list(tensors)
        return [self._pinned(f"in{i}", t).to(self.device, non_blocking=True) for i, t in enumerate(tensors)]

    def to_host(self, tensors: Sequence[torch.Tensor], finish: Callable[[list[torch.Tensor]], object]) -> "Pending":
        """Device outputs -> a Pending whose result() is finish(host tensors), once the copies landed."""
        if self.device.type == "cpu":
            return Pending(None, list(tensors), finish)
        host = []
        for i, t in enumerate(tensors):
            buffer = self._buffer(f"out{i}", t.dtype, t.numel()).view(t.shape)
            host.append(buffer.copy_(t, non_blocking=True))
        self.event.record()  # on the current stream, after the copies
        return Pending(self.event, host, finish)

    def _pinned(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """t copied into its pinned buffer (a host memcpy), viewed with t's shape."""
        return self._buffer(name, t.dtype, t.numel()).view(t.shape).copy_(t)

    def _buffer(self, name: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        key = (name, dtype)
        held = self._buffers.get(key)
        if held is None or held.numel() < numel:
            size = 1 << max(numel - 1, 1).bit_length()  # grow by powers of two: few allocations
            held = self._buffers[key] = torch.empty(size, dtype=dtype, pin_memory=True)
        return held[:numel]


class Pending:
    """A call whose outputs may still be on their way to the host."""

    def __init__(self, event: torch.cuda.Event | None, host: list[torch.Tensor], finish: Callable) -> None:
        self._event, self._host, self._finish = event, host, finish

    def result(self):
        """Wait for the copies (never inside the enqueue), then build the result from private copies
        of the outputs (the pinned buffers belong to the lane's next call)."""
        if self._event is not None:
            self._event.synchronize()
            return self._finish([t.clone() for t in self._host])
        return self._finish(self._host)
