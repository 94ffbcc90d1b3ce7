"""shared/decode_errors.py: msgspec's errors located in the declared type and said in words, the one
translator every msgspec decoder of the project uses."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest
from msgspec import Meta

from shared.decode_errors import MISSING, Style, locate

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("gateway", "worker", "shared", "compile", "loadgen", "bench")


class Row(msgspec.Struct, array_like=True):
    name: Annotated[str, Meta(min_length=1)]
    count: Annotated[int, Meta(ge=0, extra={"noun": "widget"})] = 0


class Body(msgspec.Struct, forbid_unknown_fields=True):
    rows: list[Row]
    kind: Literal["a", "b"] | None = None
    item: str | list[int] | None = None


def error_of(cls: type, value: object) -> msgspec.ValidationError:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(value, cls)
    return caught.value


def test_array_like_positions_are_named_by_their_fields():
    sent = {"rows": [["x", 1], ["y", -3]]}
    error = locate(error_of(Body, sent), Body, sent)
    assert error.where() == "$.rows[1].count" and error.value == -3
    assert error.message() == "$.rows[1].count = -3 must be an integer widget of at least 0"
    assert error.message(Style(root="")) == "rows[1].count = -3 must be an integer widget of at least 0"


def test_a_union_is_described_by_the_member_the_value_takes():
    sent = {"rows": [], "item": [1, "two"]}
    assert locate(error_of(Body, sent), Body, sent).message() == '$.item[1] = "two" must be an integer'
    sent = {"rows": [], "kind": "c"}
    assert locate(error_of(Body, sent), Body, sent).message() == '$.kind = "c" must be one of a, b'


def test_unknown_and_missing_fields_name_the_known_ones_and_the_type_wanted():
    sent = {"rows": [], "colour": 1}
    assert locate(error_of(Body, sent), Body, sent).message() == (
        "unknown field 'colour' in the request body ($); known fields: rows, kind, item")
    sent = {"kind": "a"}
    assert locate(error_of(Body, sent), Body, sent).message() == (
        "missing required field $.rows (a list of arrays of its 2 fields name, count (the first 1 required))")


def test_an_unknown_field_is_named_whatever_its_characters_and_a_long_name_is_shortened():
    sent = {"rows": [], "a`b": 1}
    assert locate(error_of(Body, sent), Body, sent).message() == (
        "unknown field 'a`b' in the request body ($); known fields: rows, kind, item")
    sent = {"rows": [], "x" * 1000: 1}
    assert locate(error_of(Body, sent), Body, sent).message() == (
        f"unknown field '{'x' * 77}...' in the request body ($); known fields: rows, kind, item")


def test_without_the_value_sent_the_place_and_the_rule_are_still_said():
    sent = {"rows": [[""]]}
    error = locate(error_of(Body, sent), Body)
    assert error.value is MISSING and error.message() == "$.rows[0].name must be a string of at least 1 character"


def _catches_validation_errors(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ExceptHandler) and node.type is not None and "ValidationError" in ast.unparse(node.type):
            return True
    return False


def test_every_module_that_catches_msgspec_errors_words_them_with_the_one_translator():
    """A second translator (a regex over msgspec's message, a walk of its path) is a defect: every
    module that catches msgspec.ValidationError hands it to shared/decode_errors.py."""
    catching = [p for package in SOURCES for p in sorted((ROOT / package).rglob("*.py")) if _catches_validation_errors(p)]
    assert {p.relative_to(ROOT).as_posix() for p in catching} >= {
        "gateway/api/decoding.py", "shared/protocol/codec.py", "shared/config.py"}
    for path in catching:
        assert "shared.decode_errors" in path.read_text(), f"{path.relative_to(ROOT)} words msgspec's errors itself"
