"""POST /admin/constraints bodies and answers: catalogues to load (name -> a trie or sequences file the
workers can read) and names to unload, parsed into a ConstraintsUpdate; the answer names each worker's
catalogue version. gateway/catalog_admin.py sends the update to the workers."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from gateway.errors import ApiError

CatalogName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
CatalogPath = Annotated[str, Meta(min_length=1, max_length=4096)]


class ConstraintsUpdate(Struct, forbid_unknown_fields=True):
    """Catalogues to load as one new version, and names to unload."""

    load: Annotated[dict[CatalogName, CatalogPath], Meta(max_length=1024)] = {}
    unload: Annotated[list[CatalogName], Meta(max_length=1024)] = []


class WorkerCatalog(Struct):
    endpoint: str
    version: int | None
    """The worker's current catalogue version (None: it did not answer)."""
    items: dict[str, int] = {}
    error: str = ""


class ConstraintsAnswer(Struct):
    workers: list[WorkerCatalog]


def parse_update(raw: bytes) -> ConstraintsUpdate:
    try:
        update = msgspec.json.decode(raw, type=ConstraintsUpdate)
    except msgspec.DecodeError as exc:
        raise ApiError("invalid_request", f"/admin/constraints: {exc}") from None
    if not update.load and not update.unload:
        raise ApiError("invalid_request", "/admin/constraints: name catalogues to `load` ({name: path}) or `unload`")
    both = sorted(set(update.load) & set(update.unload))
    if both:
        raise ApiError("invalid_request", f"/admin/constraints: {both} are both loaded and unloaded")
    return update
