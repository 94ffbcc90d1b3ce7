"""Answers CatalogSwap messages: the swap runs on a thread of its own (reading and checking a 1M-item
catalogue takes a fraction of a second to seconds), never on the receive loop, and its CatalogState
answer reaches the gateway through the compute threads' outbox like any reply."""

from __future__ import annotations

import threading

import zmq

from shared.protocol import CatalogState, CatalogSwap, encode
from worker.catalog_store import CatalogStore
from worker.logs import JsonLog


def swap_answer(store: CatalogStore | None, swap: CatalogSwap) -> CatalogState:
    """Apply `swap` to `store` and say what is loaded now, or why nothing changed."""
    if store is None:
        return CatalogState(swap.request_id, 0, error="this worker's beam node is unconstrained (built with "
                                                      "beam.max_catalog_nodes = 0): it loads no catalogues")
    try:
        summary = store.update(swap.load, swap.unload)
    except (ValueError, OSError) as exc:  # a bad file, a set beyond the compiled tables, an unknown name
        return CatalogState(swap.request_id, store.version, error=str(exc))
    return CatalogState(swap.request_id, summary.version, items=summary.items, nodes=summary.nodes,
                        max_nodes=summary.max_nodes, load_s=round(summary.load_s, 4))


class CatalogAdmin:
    """Runs each swap on a thread and pushes its answer to the receive loop's outbox (one swap installs
    at a time: CatalogStore serialises them)."""

    def __init__(self, store: CatalogStore | None, log: JsonLog) -> None:
        self.store = store
        self.log = log
        self._threads: list[threading.Thread] = []

    def start_swap(self, peer: bytes, swap: CatalogSwap, context: zmq.Context, outbox: str) -> None:
        thread = threading.Thread(target=self._swap, args=(peer, swap, context, outbox), name="catalog-swap",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def join(self, timeout_s: float) -> None:
        """At exit: let the swaps in progress answer."""
        for thread in self._threads:
            thread.join(timeout_s)

    def _swap(self, peer: bytes, swap: CatalogSwap, context: zmq.Context, outbox: str) -> None:
        try:
            answer = swap_answer(self.store, swap)
        except Exception as exc:  # never a swap left unanswered (a MemoryError packing a huge catalogue)
            version = self.store.version if self.store is not None else 0
            answer = CatalogState(swap.request_id, version, error=f"{type(exc).__name__}: {exc}")
        if answer.error:
            self.log.warning("catalog_refused", request_id=swap.request_id, error=answer.error, version=answer.version)
        else:
            self.log.info("catalog_swapped", request_id=swap.request_id, version=answer.version, items=answer.items,
                          nodes=answer.nodes, max_nodes=answer.max_nodes, load_s=answer.load_s)
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, -1)
        push.connect(outbox)
        try:
            push.send_multipart([peer, *encode(answer)])
        finally:
            push.close()
