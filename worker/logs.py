"""Structured logs: one JSON object per line on stderr, with the worker id and request ids."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

import orjson


class JsonLog:
    """Writes `{"ts": ..., "worker": ..., "event": ..., **fields}` lines; safe across threads."""

    def __init__(self, worker_id: str, stream: IO[str] | None = None, debug: bool = False) -> None:
        self.worker_id = worker_id
        self.stream = stream or sys.stderr
        self.debug_enabled = debug
        self._lock = threading.Lock()

    def info(self, event: str, **fields: Any) -> None:
        self._write("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._write("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._write("error", event, fields)

    def debug(self, event: str, **fields: Any) -> None:
        if self.debug_enabled:
            self._write("debug", event, fields)

    def _write(self, level: str, event: str, fields: dict[str, Any]) -> None:
        record = {"ts": round(time.time(), 6), "level": level, "worker": self.worker_id, "event": event, **fields}
        line = orjson.dumps(record, default=str).decode()
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
