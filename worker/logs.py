"""The worker's logs: shared.logs' JSON event lines, each carrying the worker's id."""

from __future__ import annotations

import logging

from shared.logs import EventLog, setup_logging


class JsonLog(EventLog):
    """Writes {"ts", "level", "logger": "worker", "event", "worker": <id>, **fields} lines to stderr."""

    def __init__(self, worker_id: str, debug: bool = False) -> None:
        setup_logging(logging.DEBUG if debug else logging.INFO)
        super().__init__("worker", worker=worker_id)
        self.worker_id = worker_id
