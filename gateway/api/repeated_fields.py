"""400 when an object of a request body names a field twice: msgspec, like most JSON readers, keeps the
last and drops the others without a word, so `{"samples": [...], "samples": [...]}` would lose samples.

`refuse_repeated_fields` is the check itself: Python's JSON reader sees every pair; arrays of numbers
(token ids), which hold no object, are emptied first (a regular expression): about 80 us of CPU for
15 x 500 token ids (bench/request_decode.py's body, on a loaded machine). `RepeatedFields(root)`, made
once per request Struct, skips it for a body that provably repeats nothing, a body of one object
(texts, or lists of token ids), in one scan of its quotes: after msgspec decoded the body as `root`,
which refuses unknown fields, each key of the root object is one of its fields, so when the body holds
one object only and no field's key, `"name"`, occurs twice in its bytes, no field was given twice (a
text that spells a key only sends it to the full check). A key may spell its letters as escapes
(`"\\u0073amples"` is `samples`), which the scan would miss: a body with such an escape takes the full
check. A body of several objects (samples as objects, a dict) takes it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.errors import ApiError
from shared.decode_errors import type_info

NUMBER_ARRAY = re.compile(rb"\[[-+.0-9eE, \n\r\t]*\]")
"""An array of numbers (JSON's whitespace spelled out: the class `\\s` makes the search twice as slow)."""
ESCAPED_ASCII = re.compile(rb"\\u00[0-7]")
"""An escape that may spell a field name's character (all are ASCII)."""


class RepeatedFields:
    """The repeated-field check of one request Struct's bodies, skipped where the body's keys prove it needless."""

    def __init__(self, root: type) -> None:
        info = type_info(root)
        keys = b"|".join(re.escape(f'"{f.encode_name}"'.encode()) for f in info.fields)
        self._key = re.compile(keys) if info.forbid_unknown_fields else None
        """Each field's key as the body spells it; None: unknown fields are kept, so any key may repeat."""

    def refuse(self, raw: bytes) -> None:
        """400 when an object of `raw`, a body msgspec decoded as the root Struct, names a field twice."""
        if self._key is not None and raw.find(b"{", raw.find(b"{") + 1) == -1 and (
                b"\\" not in raw or not ESCAPED_ASCII.search(raw)):
            keys = self._key.findall(raw)  # one scan from quote to quote (a literal first byte is searched fast)
            if len(set(keys)) == len(keys):
                return
        refuse_repeated_fields(raw)


def refuse_repeated_fields(raw: bytes) -> None:
    """400 when an object of the body (valid JSON) names a field twice; a body Python's JSON reader does
    not read passes (msgspec's answer about it stands)."""
    def pairs(items: list[tuple[str, Any]]) -> None:
        names = [name for name, _ in items]
        if len(set(names)) != len(names):
            repeated = next(name for name in names if names.count(name) > 1)
            raise ApiError("invalid_request", f"the body gives the field {repeated!r} {names.count(repeated)} times "
                                              "in one object; give each field once (JSON does not say which would "
                                              "count)")

    try:
        json.loads(NUMBER_ARRAY.sub(b"[]", raw), object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return

