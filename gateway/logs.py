"""Structured logs: one JSON object per line on stderr (access lines are already JSON)."""

from __future__ import annotations

import logging
import sys

import orjson


class JsonLines(logging.Formatter):
    """Formats a record as {"ts", "level", "logger", "message"}; access records pass through."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == "gateway.access":
            return message
        line = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
                "message": message}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the gateway writes its own access lines
