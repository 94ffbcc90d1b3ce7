"""`[beam] constraints` watched: when the file changes (rewritten in place or replaced by a rename), the
worker loads it as its default catalogue, a new version, between batches, without a restart.

The watch compares the file's identity and modification time (st_ino, st_mtime_ns, st_size) on an
interval, on a thread of its own; a file that is mid-write or bad is refused by the store as any update
is (the current version keeps serving) and tried again only when it changes again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from shared.catalog import DEFAULT_CATALOG
from worker.catalog_store import CatalogStore
from worker.logs import JsonLog


class CatalogWatch:
    """Reloads `path` into `store` as the default catalogue whenever the file changes."""

    def __init__(self, store: CatalogStore, path: str | Path, interval_s: float, log: JsonLog) -> None:
        self.store = store
        self.path = Path(path)
        self.interval_s = interval_s
        self.log = log
        self._seen = self._stamp()  # the file the worker loaded at start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def check(self) -> int | None:
        """One look at the file: the new version when it changed and loaded, else None."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return None
        self._seen = stamp
        try:
            version = self.store.swap(self.path, DEFAULT_CATALOG)
        except (ValueError, OSError) as exc:
            self.log.warning("catalog_refused", path=str(self.path), error=str(exc), version=self.store.version)
            return None
        self.log.info("catalog_reloaded", path=str(self.path), version=version)
        return version

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="catalog-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
