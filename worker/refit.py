"""The background refit after a fast restart: time the profiling grid again while the worker is idle.

A restarted worker serves with its last cached profile (worker/profile_cache.py); this thread then
measures the grid afresh on a lane of its own, starting `START_DELAY_S` after serving began (the
gateways reconnect and traffic resumes first), only while no batch is queued or computing, and keeps
a measurement only if no served batch came or went during it (a disturbed one is taken again). A
compiled call cannot be interrupted, so a batch that arrives during a measurement waits for it: only
grid points whose last measurement took at most `MAX_CALL_MS` are measured again; larger ones keep
their cached time until a cold start times the whole grid. When done, the Ready that answers every
later Hello carries the refit and the cache is rewritten.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping

from shared.events import ProfileRefitFailed, ProfileRefitStopped, ProfileRefitted
from shared.latency_model import LatencyModel
from worker.profiler import MIN_POINTS, Plan, Profile, runs_on

IDLE_POLL_S = 0.02
START_DELAY_S = 5.0
MAX_CALL_MS = 100.0  # the longest a served batch may wait behind one refit call (as last measured)


class BackgroundRefit:
    """Runs once on its own thread; `activity()` is None while the worker is busy, else a value that
    changes whenever a served batch starts or ends."""

    def __init__(self, plans: Mapping[str, Plan], cached: Mapping[str, Profile], lane, repeats: int,
                 budget_s: float, activity: Callable[[], object | None],
                 publish: Callable[[dict[str, Profile]], None], log) -> None:
        self.plans, self.lane, self.repeats, self.budget_s = plans, lane, repeats, budget_s
        self.cached_ms = {w: {(b, length): ms for b, length, ms in p.samples} for w, p in cached.items()}
        self.activity, self.publish, self.log = activity, publish, log
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="profile-refit", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        if self.stop.wait(START_DELAY_S):
            return
        try:
            profiles = self._measure()
        except Exception as exc:  # the cached profile stays in use; say why the refit ended
            self.log.emit(ProfileRefitFailed(error=f"{type(exc).__name__}: {exc}"), logging.ERROR)
            return
        if profiles is None:
            self.log.emit(ProfileRefitStopped())
            return
        for workload, profile in profiles.items():
            self.log.emit(ProfileRefitted(workload=workload, points=len(profile.samples),
                                          rmse_ms=round(profile.rmse_ms, 4), **profile.model.to_dict()))
        self.publish(profiles)

    def _measure(self) -> dict[str, Profile] | None:
        """New profiles, or None when the worker began to stop first."""
        share_s = self.budget_s / max(1, len(self.plans))
        profiles = {}
        for workload, (runner, batches) in self.plans.items():
            samples = self._measure_grid(runs_on(runner, self.lane), batches, self.cached_ms.get(workload, {}),
                                         share_s)
            if samples is None:
                return None
            model = LatencyModel.fit(samples)
            profiles[workload] = Profile(model, model.rmse_ms(samples), tuple(samples))
        return profiles

    def _measure_grid(self, run, batches, cached_ms: dict, budget_s: float) -> list | None:
        """(B, L, ms) of the grid: measured again where the last time was short, cached elsewhere."""
        quick = [cached_ms.get((b, length), 0.0) <= MAX_CALL_MS for b, length, _ in batches]
        largest = 1 if len(batches) > 1 else 0  # the grid's second point: warm its first call once, if quick
        if quick[largest] and self._quiet_ms(run, batches[largest][2]) is None:
            return None
        samples, spent_s = [], 0.0
        for (b, length, batch), measure in zip(batches, quick):
            if not measure or (spent_s > budget_s and len(samples) >= MIN_POINTS):
                if (b, length) in cached_ms:
                    samples.append((b, length, cached_ms[(b, length)]))
                continue
            times = []
            while len(times) < self.repeats:
                ms = self._quiet_ms(run, batch)
                if ms is None:
                    return None
                if ms >= 0:
                    times.append(ms)
                    spent_s += ms / 1000.0
            samples.append((b, length, statistics.median(times)))
        return samples

    def _quiet_ms(self, run, batch) -> float | None:
        """Milliseconds of one call made while idle; -1.0 when served work disturbed it; None: stop."""
        while (before := self.activity()) is None:
            if self.stop.wait(IDLE_POLL_S):
                return None
        if self.stop.is_set():
            return None
        started = time.perf_counter()
        run(batch)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        return elapsed_ms if self.activity() == before else -1.0
