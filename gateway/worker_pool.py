"""All workers of the deployment: connection, liveness watchdog, least-loaded choice, predictions.

With `[worker] discovery = "dns"` the workers are what gateway/discovery.py last found: a new
address gets a link (connect, handshake, Hello); an address gone is retired: nothing more is routed
to it, and its link closes once its in-flight batches are answered (a worker lost meanwhile fails
them, as any lost worker does). A lost worker asks discovery to look again at once.

Each link runs under a keeper task: whatever stops its reader (a socket error, a bug) is logged,
fails what was in flight there (503 worker_lost) and the link gets a new socket, so it reconnects.
Liveness comes from the transport (gateway/liveness.py): a closed connection or unanswered ZMTP
heartbeats declare a worker lost within `worker_timeout_ms`. The watchdog fails the batches of a
worker that stalled (a batch far past its prediction) and keeps saying Hello to workers that are
not ready, so a restarted worker rejoins by itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable

import zmq.asyncio

from shared.latency_correction import CorrectedModel
from gateway.discovery import DnsDiscovery
from gateway.job import DONE, Job
from gateway.liveness import LivenessPolicy
from gateway.worker_link import CONNECTING, LOST, READY, STALLED, Answered, WorkerLink
from shared.bounds import Bounds
from shared.policy import least_busy
from shared.policy.routing import Placement, RecentHolders
from shared.work import NO_REUSE, Reuse, StaticPrefix

log = logging.getLogger("gateway.pool")
RELINK_DELAY_S = 0.1  # before a link whose reader stopped gets its new socket (no busy loop on a bug)


class WorkerPool:
    """The gateway's workers; `pick` chooses the least-loaded ready one with a free batch slot (beam
    search), `serving` and `recent` are what the score batcher routes by (shared/policy/routing.py)."""

    def __init__(self, endpoints: tuple[str, ...], worker_timeout_ms: int, max_inflight_batches: int,
                 on_answer: Callable[[Answered], None] = lambda answer: None, static: StaticPrefix = NO_REUSE,
                 discovery: DnsDiscovery | None = None, bounds: Bounds | None = None) -> None:
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self.liveness = LivenessPolicy.from_timeout(worker_timeout_ms)
        self.max_inflight_batches = max_inflight_batches
        self.static = static
        self.recent = RecentHolders()
        """Which worker each prefix was last sent to (routing's memory: shared/policy/routing.py)."""
        self._loop = asyncio.get_running_loop()
        self._on_answer = on_answer
        self.bounds = bounds
        """The gateway's compiled bounds: a worker whose Ready names others is not served (WorkerLink)."""
        self.links = [self._link(e) for e in endpoints]
        self.discovery = discovery
        self.retiring: set[WorkerLink] = set()
        """Links to addresses discovery no longer finds: not routed to; closed once nothing is in flight."""
        self._keepers: dict[WorkerLink, asyncio.Task[None]] = {}
        self._looked_again: dict[WorkerLink, float] = {}
        """The loss (its out_of_service_since) each link last asked discovery to look again for."""
        self._listeners: list[Callable[[], None]] = []
        self._requeue: Callable[[list[Job]], None] = lambda jobs: None
        self._batch_ids = itertools.count(1)
        self._context: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` when a worker becomes ready or lost, or a batch slot frees up."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def on_returned(self, requeue: Callable[[list[Job]], None]) -> None:
        """Queue again, with `requeue`, the jobs a draining worker gave back uncomputed."""
        self._requeue = requeue

    def _returned(self, jobs: list[Job]) -> None:
        live = [job for job in jobs if job.state != DONE]  # not answered meanwhile (a sibling failed, the client left)
        if live:
            self._requeue(live)

    def _link(self, endpoint: str) -> WorkerLink:
        return WorkerLink(endpoint, self.gateway_id, self._loop.time, self._changed, self._on_answer, self.static,
                          self._returned, self.bounds)

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        for link in self.links:
            self._keep(link)
        self._spawn(self._watch, "worker watchdog")
        if self.discovery is not None:
            discovery = self.discovery
            self._spawn(lambda: discovery.run(self.set_endpoints), f"discovery of {discovery.service}")

    def _keep(self, link: WorkerLink) -> None:
        self._keepers[link] = self._spawn(lambda: self._keep_link(link), f"link {link.endpoint}")

    def _spawn(self, run: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(run(), name=name)
        task.add_done_callback(lambda done: self._ended(done, run))
        self._tasks.append(task)
        return task

    def set_endpoints(self, endpoints: frozenset[str]) -> None:
        """The workers are now those at `endpoints` (discovery's latest answer): link the new ones,
        retire the ones gone, take back a retiring one that is found again."""
        known = {link.endpoint: link for link in self.links}
        for endpoint in sorted(endpoints - set(known)):
            log.info("worker %s found; connecting", endpoint)
            link = self._link(endpoint)
            self.links.append(link)
            if self._context is not None:
                self._keep(link)
        for endpoint, link in known.items():
            if endpoint in endpoints and link in self.retiring:
                log.info("worker %s found again", endpoint)
                self.retiring.discard(link)
            elif endpoint not in endpoints and link not in self.retiring:
                log.info("worker %s no longer found; retiring it once its %d batch(es) in flight are answered",
                         endpoint, len(link.in_flight))
                self.retiring.add(link)
        self._close_retired()
        self._changed()

    def _close_retired(self) -> None:
        """Close and forget retiring links with nothing in flight."""
        for link in [link for link in self.retiring if not link.in_flight]:
            self.retiring.discard(link)
            self.links.remove(link)
            self._looked_again.pop(link, None)
            keeper = self._keepers.pop(link, None)
            if keeper is not None and keeper in self._tasks:
                self._tasks.remove(keeper)  # ended on purpose: not to be started again (_ended)
                keeper.cancel()
            link.close()
            log.info("worker %s retired", link.endpoint)

    def _ended(self, task: asyncio.Task[None], run: Callable[[], Awaitable[None]]) -> None:
        """A pool task ended: expected only when the pool stops; otherwise say why and start it again."""
        if task not in self._tasks:  # a retired link's keeper
            return
        self._tasks.remove(task)
        if self._stopping or task.cancelled():
            return
        error = task.exception()
        log.error("gateway task %r ended (%s); starting it again", task.get_name(),
                  f"{type(error).__name__}: {error}" if error else "it returned", exc_info=error)
        self._spawn(run, task.get_name())

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self.links:
            if link.in_flight:
                link.declare_lost("the gateway is stopping")
            link.close()
        if self._context is not None:
            self._context.term()
            self._context = None

    async def _keep_link(self, link: WorkerLink) -> None:
        """Keep `link` open and read: when its reader stops for any reason, say why, fail what was
        in flight there and give it a new socket (a fresh connection, handshake and Hello)."""
        assert self._context is not None
        while True:
            try:
                link.open(self._context, self.liveness)
                why = await link.serve()
            except Exception as exc:  # a bug below the reader, or no socket: it must not end this link for good
                log.exception("the link to worker %s failed", link.endpoint)
                why = f"{type(exc).__name__}: {exc}"
            finally:
                link.close()
            log.error("the link to worker %s stopped (%s); reconnecting with a new socket", link.endpoint, why)
            link.declare_lost(f"the gateway's link to it stopped: {why}")
            await asyncio.sleep(RELINK_DELAY_S)

    async def _watch(self) -> None:
        """Fail the batches of stalled workers; say Hello to workers that are not ready; close the
        retired links that have nothing in flight left."""
        while True:
            await asyncio.sleep(self.liveness.check_period_s)
            now = self._loop.time()
            for link in list(self.links):
                try:
                    self._check(link, now)
                except Exception:  # one link's bug must not stop watching the others
                    log.exception("checking worker %s failed", link.endpoint)
            self._close_retired()

    def _check(self, link: WorkerLink, now: float) -> None:
        why = self.liveness.stalled(link.in_flight.values(), now)
        if why is not None and not self._stopping:
            link.declare_lost(why, STALLED)
        if link.state in (CONNECTING, LOST) and link not in self.retiring:
            link.hello()
            lost_at = link.out_of_service_since
            if self.discovery is not None and lost_at is not None and self._looked_again.get(link) != lost_at:
                self._looked_again[link] = lost_at  # once per loss: gone for good, or moved to another address?
                self.discovery.resolve_soon()

    def declare_lost(self, endpoint: str, why: str) -> None:
        """For the supervisor: a worker process it watches has exited."""
        for link in self.links:
            if link.endpoint == endpoint:
                link.declare_lost(why)

    def ready_pid(self, endpoint: str) -> int:
        """For the supervisor: the pid of the worker ready at `endpoint` now, else 0."""
        return next((link.pid for link in self.links if link.endpoint == endpoint and link.state == READY), 0)

    def stuck_pid(self, endpoint: str) -> int | None:
        """For the supervisor: the pid of the worker at `endpoint` if it was ready and is now stalled,
        or lost for longer than the policy's stuck_restart_s (its process runs but does not answer)."""
        now = self._loop.time()
        for link in self.links:
            since = link.out_of_service_since
            if link.endpoint != endpoint or since is None or link.state == READY or not link.pid:
                continue
            if link.state == STALLED or now - since > self.liveness.stuck_restart_s:
                return link.pid
        return None

    # ---- choice and prediction ---------------------------------------------------------------

    def _routable(self, workload: str | None = None) -> list[WorkerLink]:
        """The ready links (serving `workload`, when given) that are not retiring."""
        return [link for link in self.links if link not in self.retiring
                and (link.state == READY if workload is None else link.serves(workload))]

    def ready_count(self, workload: str | None = None) -> int:
        return len(self._routable(workload))

    def pick(self, workload: str) -> WorkerLink | None:
        """The ready worker with the least predicted work in flight and a free slot, or None."""
        return least_busy(self._routable(workload), self._loop.time(), self.max_inflight_batches)

    def serving(self, workload: str) -> dict[str, WorkerLink]:
        """The ready workers serving `workload`, by endpoint (routing's names)."""
        return {link.endpoint: link for link in self._routable(workload)}

    def expected_reuse(self, key: int | None) -> Reuse:
        """What a scoring job whose prefix is `key` is expected to reuse where it will run: its prefix's
        home (recent holder, else ring owner: routing.py) and the prefixes that worker reports
        holding; the static prefix alone when it has no shared prefix or no home."""
        if key is None:
            return self.static
        workers = self.serving("score")
        home = Placement(workers, self._loop.time(), self.max_inflight_batches, self.recent).home(key)
        return workers[home].reuse if home else self.static

    def model(self, workload: str) -> CorrectedModel | None:
        """The latency model of the fastest ready worker for `workload` (used for admission)."""
        models = [link.latency_models[workload] for link in self._routable(workload)]
        return min(models, key=lambda m: m.predict_ms(1, 64), default=None)

    def soonest_free_ms(self, workload: str) -> float:
        """Predicted milliseconds until some ready worker has finished its work in flight."""
        now = self._loop.time()
        return min((link.busy_ms(now) for link in self._routable(workload)), default=0.0)

    def clock(self) -> float:
        """Seconds on the event loop's monotonic clock (deadlines are kept on it)."""
        return self._loop.time()

    def next_batch_id(self) -> int:
        return next(self._batch_ids)

    def in_flight_batches(self) -> int:
        return sum(len(link.in_flight) for link in self.links)
