"""The events other processes read from a worker's log, declared once as msgspec Structs.

A worker writes them with `EventLog.emit` (shared/logs.py): one JSON line, {"ts", "level",
"logger", "event": <tag>, "worker": <id>, **fields}. Tools (loadgen's stack and calibration, bench)
read them back with `read_events`, by type: a line is decoded against these declarations, never
matched as a substring. Every other log line is for people and may change its wording freely.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Union

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="event"):
    """A fact a worker reports; `ts` and `worker` are filled in by the logger (shared/logs.py)."""

    ts: float = 0.0
    """When it was logged (Unix seconds)."""
    worker: str = ""
    """The worker's id."""


class Standby(Event, tag="standby"):
    """A spare worker has imported torch and probed the CPU; it waits for an assignment."""


class Serving(Event, tag="serving"):
    """The worker's socket is bound and it answers Hello."""

    endpoint: str
    pid: int
    workloads: tuple[str, ...]


class Profile(Event):
    """A workload's latency profile (shared/latency_model.py's coefficients) and its fit."""

    workload: str
    points: int
    rmse_ms: float
    alpha: float
    beta: float
    gamma: float
    delta: float

    def coefficients(self) -> dict[str, float]:
        return {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "delta": self.delta}


class Profiled(Profile, tag="profiled"):
    """Measured at start-up, before serving."""


class ProfileReused(Profile, tag="profile_reused"):
    """Read from the profile cache at start-up (a background refit follows)."""

    path: str


class ProfileRefitted(Profile, tag="profile_refitted"):
    """Measured again in the background after a start on a cached profile."""


class ProfileRefitFailed(Event, tag="profile_refit_failed"):
    """The background refit failed; the cached profile stays in use."""

    error: str


class ProfileRefitStopped(Event, tag="profile_refit_stopped"):
    """The background refit ended early because the worker began to stop."""


class BatchDone(Event, tag="batch_done"):
    """A batch answered: which requests were computed, expired or rejected, and what it cost."""

    batch_id: int
    request_ids: tuple[str, ...]
    """The gateway's wire ids of the batch's requests."""
    queue_ms: float
    compute_ms: float
    expired: tuple[str, ...] = ()
    rejected: dict[str, str] = {}
    """Request id -> why it alone was refused."""


AnyEvent = Union[Standby, Serving, Profiled, ProfileReused, ProfileRefitted, ProfileRefitFailed,
                 ProfileRefitStopped, BatchDone]
PROFILE_EVENTS = (Profiled, ProfileReused, ProfileRefitted)
SETTLED = (Profiled, ProfileRefitted, ProfileRefitFailed, ProfileRefitStopped)
"""After these a worker's profile no longer changes (and no refit holds its compute lane)."""

_DECODER = msgspec.json.Decoder(AnyEvent)


def parse_events(text: str | bytes) -> Iterator[AnyEvent]:
    """The declared events among `text`'s lines, in order; other lines (and text before a line's
    JSON, e.g. a supervisor's prefix) are skipped."""
    data = text.encode() if isinstance(text, str) else text
    for line in data.splitlines():
        start = line.find(b"{")
        if start < 0:
            continue
        try:
            yield _DECODER.decode(line[start:])
        except msgspec.DecodeError:
            continue  # another event or logger's line (its tag is not declared here), or a torn last line


def read_events(path: str | Path, *types: type[Event]) -> list[AnyEvent]:
    """The events of `types` (default: all) in the log file at `path`, in order."""
    if not Path(path).exists():
        return []
    events = parse_events(Path(path).read_bytes())
    return [e for e in events if not types or isinstance(e, types)]
