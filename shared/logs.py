"""Structured logs for every process: one JSON object per line on stderr.

One formatter for the standard `logging` module. A record logged with `extra={"fields": {...}}` is
an event: {"ts", "level", "logger", "event": <message>, **fields}; the events other processes read
are declared in shared/events.py and written with `EventLog.emit`; any other record is {"ts", "level", "logger",
"message"}, plus "exception" when it carries one. Records of `passthrough` loggers are already JSON
(the gateway's access lines) and are written as they are.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson

from shared.events import Event


class JsonLines(logging.Formatter):
    """Formats a record as one JSON object (see the module docstring)."""

    def __init__(self, passthrough: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.passthrough = passthrough

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name in self.passthrough:
            return message
        line: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields is None:
            line["message"] = message
        else:
            line["event"] = message
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


@contextlib.contextmanager
def json_logging(level: int = logging.INFO, passthrough: frozenset[str] = frozenset(),
                 levels: dict[str, int] | None = None) -> Iterator[None]:
    """While inside, every logger of this process writes JSON lines to stderr (and each logger named in
    `levels` logs at that level); on leaving, the root logger's handlers and every level are as they were.

    A process's main() runs inside it. A main() called in a test (the CLI's refusals are tested in-process)
    leaves no handler behind on that test's captured stderr, which pytest closes when the test ends: such a
    handler turned a later test's log record (an event loop's warning at garbage collection, say) into
    "--- Logging error ---" and a traceback on whatever test was running then.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(passthrough))
    root = logging.getLogger()
    loggers = [root] + [logging.getLogger(name) for name in levels or {}]
    saved_handlers, saved_levels = root.handlers[:], [logger.level for logger in loggers]
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name, named_level in (levels or {}).items():
        logging.getLogger(name).setLevel(named_level)
    try:
        yield
    finally:
        root.handlers[:] = saved_handlers
        for logger, saved in zip(loggers, saved_levels):
            logger.setLevel(saved)
        handler.close()


class EventLog:
    """Events with fields on one logger: log.info("batch_done", batch_id=3, ...); the fields given at
    construction (e.g. the worker's id) go on every line. Thread-safe (logging's handler lock)."""

    def __init__(self, name: str, **common: Any) -> None:
        self._logger = logging.getLogger(name)
        self._common = common

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": {**self._common, **fields}})

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def emit(self, event: Event, level: int = logging.INFO) -> None:
        """A declared event (shared/events.py): the line its reader decodes by type."""
        fields = msgspec.structs.asdict(event)
        del fields["ts"], fields["worker"]  # the formatter's time and this log's common fields
        self._log(level, event.__struct_config__.tag, fields)
