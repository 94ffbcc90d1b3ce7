"""POST /admin/constraints: a new catalogue version on every worker, without a rebuild or a restart.

The body names catalogues to load (name -> a trie or sequences file the workers can read) and to
unload; each ready worker gets one CatalogSwap (shared/protocol) and builds the next version beside
the batches it runs, then answers CatalogState. The route answers once every worker has answered or
the timeout has passed: 200 with each worker's version when all of them switched, else 502
`catalog_update_failed` naming each worker that did not (its current version stays in service).
The route needs the bearer token (gateway.auth_token_env): a gateway without one refuses it. Its body
and answer types and their parsing are gateway/api/constraints.py's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from gateway.api.constraints import ConstraintsAnswer, ConstraintsUpdate, WorkerCatalog
from gateway.errors import ApiError
from gateway.worker_link import READY, WorkerLink
from shared import protocol

CATALOG_UPDATE_TIMEOUT_S = 30.0
"""How long a worker may take to build a catalogue version (a 1M-item sequences file: seconds)."""


class CatalogAdmin:
    """Sends a CatalogSwap to each ready worker and gathers their CatalogState answers by request id."""

    def __init__(self, links: Callable[[], list[WorkerLink]], timeout_s: float) -> None:
        self._links = links
        """The pool's links as they are at each update (workers may come and go)."""
        self._timeout_s = timeout_s
        self._pending: dict[str, asyncio.Future[protocol.CatalogState]] = {}

    def _answered(self, state: protocol.CatalogState) -> None:
        future = self._pending.get(state.request_id)
        if future is not None and not future.done():
            future.set_result(state)

    async def update(self, change: ConstraintsUpdate) -> ConstraintsAnswer:
        ready = [link for link in self._links() if link.state == READY]
        if not ready:
            raise ApiError("no_workers", "no worker is ready to take a catalogue update")
        answers = await asyncio.gather(*(self._swap(link, change) for link in ready))
        result = ConstraintsAnswer(list(answers))
        failed = [w for w in result.workers if w.error]
        if failed:
            raise ApiError("catalog_update_failed", "; ".join(f"{w.endpoint}: {w.error}" for w in failed)
                           + " (each failed worker keeps serving its current version)")
        return result

    async def _swap(self, link: WorkerLink, change: ConstraintsUpdate) -> WorkerCatalog:
        request_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        link.on_catalog_state = self._answered
        try:
            if not link.send_control(protocol.CatalogSwap(request_id, dict(change.load), tuple(change.unload))):
                return WorkerCatalog(link.endpoint, None, error="the update could not be sent to it")
            state = await asyncio.wait_for(future, self._timeout_s)
        except asyncio.TimeoutError:
            return WorkerCatalog(link.endpoint, None, error=f"no answer within {self._timeout_s:.0f} s")
        finally:
            self._pending.pop(request_id, None)
        return WorkerCatalog(link.endpoint, state.version, dict(state.items), state.error)
