"""The worker's logs: shared.logs' JSON event lines, each carrying the worker's id."""

from __future__ import annotations

from shared.logs import EventLog


class JsonLog(EventLog):
    """Writes {"ts", "level", "logger": "worker", "event", "worker": <id>, **fields} lines through the process's
    logging (worker/__main__.py writes them to stderr, shared.logs.json_logging)."""

    def __init__(self, worker_id: str) -> None:
        super().__init__("worker", worker=worker_id)
        self.worker_id = worker_id
