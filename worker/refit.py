"""The background refit after a fast restart: time the profiling grid again while the worker is idle.

A restarted worker serves with its last cached profile (worker/profile_cache.py); this thread then
measures the grid afresh on a lane of its own, only while no batch is queued or computing, and
keeps a measurement only if no served batch came or went during it (a served batch is never held
back to protect a measurement; a disturbed one is simply taken again). When the grid is done it
publishes the new profiles: the Ready that answers every later Hello carries them and the cache is
rewritten. A served batch that arrives during a measurement waits at most that one call (lanes take
turns for the node call: worker/lanes.py); the largest grid point is the deployment's largest batch.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping

from shared.latency_model import LatencyModel
from worker.profiler import MIN_POINTS, Plan, Profile, runs_on

IDLE_POLL_S = 0.02


class BackgroundRefit:
    """Runs once on its own thread; `activity()` is None while the worker is busy, else a value that
    changes whenever a served batch starts or ends."""

    def __init__(self, plans: Mapping[str, Plan], lane, repeats: int, budget_s: float,
                 activity: Callable[[], object | None], publish: Callable[[dict[str, Profile]], None],
                 log) -> None:
        self.plans, self.lane, self.repeats, self.budget_s = plans, lane, repeats, budget_s
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
        try:
            profiles = self._measure()
        except Exception as exc:  # the cached profile stays in use; say why the refit ended
            self.log.error("profile_refit_failed", error=f"{type(exc).__name__}: {exc}")
            return
        if profiles is None:
            self.log.info("profile_refit_stopped")
            return
        for workload, profile in profiles.items():
            self.log.info("profile_refitted", workload=workload, points=len(profile.samples),
                          rmse_ms=round(profile.rmse_ms, 4), **profile.model.to_dict())
        self.publish(profiles)

    def _measure(self) -> dict[str, Profile] | None:
        """New profiles, or None when the worker began to stop first."""
        spent_s, share_s = 0.0, self.budget_s / max(1, len(self.plans))
        profiles = {}
        for workload, (runner, batches) in self.plans.items():
            run = runs_on(runner, self.lane)
            if len(batches) > 1 and self._quiet_ms(run, batches[1][2]) is None:  # the largest: warm it once
                return None
            samples, budget_end_s = [], spent_s + share_s
            for b, length, batch in batches:
                times = []
                while len(times) < self.repeats:
                    ms = self._quiet_ms(run, batch)
                    if ms is None:
                        return None
                    if ms >= 0:
                        times.append(ms)
                        spent_s += ms / 1000.0
                samples.append((b, length, statistics.median(times)))
                if spent_s > budget_end_s and len(samples) >= MIN_POINTS:
                    break
            model = LatencyModel.fit(samples)
            profiles[workload] = Profile(model, model.rmse_ms(samples), tuple(samples))
        return profiles

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
