"""The gateway's logs: shared.logs' JSON lines; its access lines are already JSON and pass through."""

from __future__ import annotations

import logging

from shared.logs import setup_logging as setup_json_logging


def setup_logging(level: int = logging.INFO) -> None:
    setup_json_logging(level, passthrough=frozenset({"gateway.access"}))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the gateway writes its own access lines
