"""The gateway's logs: shared.logs' JSON lines; its access lines are already JSON and pass through."""

from __future__ import annotations

import contextlib
import logging

from shared.logs import json_logging


def gateway_logging(level: int = logging.INFO) -> contextlib.AbstractContextManager[None]:
    """JSON lines while inside; aiohttp's own access lines off (the gateway writes its own)."""
    return json_logging(level, passthrough=frozenset({"gateway.access"}), levels={"aiohttp.access": logging.WARNING})
