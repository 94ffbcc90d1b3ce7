"""How the gateway knows a worker is alive, without needing the worker's Python to run.

Three signals, each with a bound derived from `[gateway] worker_timeout_ms` (T):
- Transport: the DEALER socket of every link exchanges ZMTP PING/PONG with the worker's ROUTER
  every T/4. libzmq's I/O threads answer them, never Python, so a worker whose compiled call holds
  the GIL for seconds still answers; one that is gone (killed, host down) or frozen (SIGSTOP) does
  not, and libzmq closes the connection once a PING is unanswered for 3T/4. A socket monitor
  reports that close (and a killed process's socket closing, which comes at once) to the link.
  Bound: a dead or frozen worker is declared lost within T.
- Compute watchdog: a worker hung inside a call keeps answering PINGs, so a batch in flight longer
  than `stall_multiple` x the predicted time of everything in flight on that worker (and at least
  `stall_floor_s`) takes the worker out of service as stalled. Generous on purpose: a batch the
  latency model underestimates tenfold is still a live worker.
- Process supervision (--spawn-workers only): a local worker that stays lost while its process
  runs (`stuck_restart_s`), or that stalled, is killed and restarted by the supervisor.

Application heartbeats still carry queue depth and counters; their silence no longer means loss.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

CONNECTION_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
_monitor_names = itertools.count()


class Batch(Protocol):
    """What the watchdog reads of a batch in flight (gateway.worker_link.InFlight)."""

    sent_at: float
    predicted_ms: float


@dataclass(frozen=True)
class LivenessPolicy:
    """Transport heartbeat options and watchdog bounds of one deployment."""

    heartbeat_ivl_ms: int
    """ZMTP PING interval on every worker connection."""
    heartbeat_timeout_ms: int
    """A connection whose PING is unanswered this long is closed (the worker is lost)."""
    heartbeat_ttl_ms: int
    """Sent to the worker: it closes a connection that is silent this long (a frozen gateway)."""
    stall_multiple: float = 20.0
    stall_floor_s: float = 10.0
    stuck_restart_s: float = 5.0
    """Supervised workers only: lost this long while the process runs means it is frozen."""

    @classmethod
    def from_timeout(cls, worker_timeout_ms: int) -> LivenessPolicy:
        """Detection within worker_timeout_ms: a PING every quarter, unanswered for the rest."""
        ivl_ms = max(10, worker_timeout_ms // 4)
        return cls(ivl_ms, max(10, worker_timeout_ms - ivl_ms), max(100, worker_timeout_ms))

    @property
    def detection_bound_ms(self) -> int:
        return self.heartbeat_ivl_ms + self.heartbeat_timeout_ms

    @property
    def check_period_s(self) -> float:
        """How often the watchdog looks at batches in flight and says Hello to absent workers."""
        return min(0.2, self.heartbeat_ivl_ms / 1000.0)

    def apply(self, socket: zmq.Socket) -> None:
        socket.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
        socket.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_ttl_ms)

    def stalled(self, batches: Iterable[Batch], now: float) -> str | None:
        """Why the worker computing `batches` counts as stalled at `now` (seconds), or None.

        The batches run one after another on a CPU worker, so the oldest one is measured against the
        predicted time of all of them together.
        """
        batches = list(batches)
        if not batches:
            return None
        waited_s = now - min(b.sent_at for b in batches)
        predicted_s = sum(b.predicted_ms for b in batches) / 1000.0
        allowed_s = max(self.stall_floor_s, self.stall_multiple * predicted_s)
        if waited_s <= allowed_s:
            return None
        return (f"no answer to a batch after {waited_s:.1f} s, over {allowed_s:.1f} s allowed "
                f"({self.stall_multiple:g}x the {predicted_s * 1000:.0f} ms predicted for its work in flight)")


def connect_monitored(context: zmq.asyncio.Context, endpoint: str,
                      policy: LivenessPolicy) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    """A DEALER to `endpoint` with the policy's heartbeats, and the PAIR socket reporting its connection
    events. Nothing is left open on failure (an open socket blocks the context's term() for good)."""
    sock = context.socket(zmq.DEALER)
    monitor = None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        # ZMQ_IMMEDIATE stays off: with it, answers that reach the socket just before the connection
        # closes are dropped with its pipe (a worker that answers and exits); the link sends only while
        # connected instead (gateway/worker_link.py)
        policy.apply(sock)
        # A name of its own: pyzmq's default names the monitor after the file descriptor, which a
        # replacement socket may reuse while the old monitor's endpoint is still bound.
        monitor = sock.get_monitor_socket(CONNECTION_EVENTS, f"inproc://link-monitor-{next(_monitor_names)}")
        sock.connect(endpoint)
    except zmq.ZMQError:
        for opened in (monitor, sock):
            if opened is not None:
                opened.close(linger=0)
        raise
    return sock, monitor
