"""The README's reference tables say what the code declares: its errors table is gateway/errors.py's table
(every code a client can receive, at its status), and every key its configuration table names is a field
of that section in shared/config.py or shared/bounds.py; it stays a short user's document."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from gateway.errors import ERRORS, SENT
from shared.config import DeploymentConfig

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def section(title: str) -> str:
    """The README's text from heading `title` to the next heading of any level."""
    start = README.index(title)
    following = re.search(r"\n#{2,3} ", README[start + len(title):])
    return README[start: start + len(title) + (following.start() if following else len(README))]


def test_the_errors_table_is_the_gateways_table():
    rows = [line for line in section("### Errors").splitlines() if re.match(r"\| \d{3}", line)]
    listed: dict[str, int] = {}
    for row in rows:
        statuses, codes = re.findall(r"\d{3}", row.split("|")[1]), re.findall(r"`(\w+)`", row.split("|")[2])
        if len(statuses) == 1:  # one status for several codes ("503 | `a` / `b`"), else one each ("404 / 405")
            statuses *= len(codes)
        assert len(statuses) == len(codes), row
        listed.update((code, int(status)) for status, code in zip(statuses, codes))
    assert listed == {code: ERRORS[code][0] for code in SENT}


def test_every_configuration_key_the_readme_names_is_declared():
    rows = [line for line in section("## Configuration").splitlines() if re.match(r"\| `\[\w+\]`", line)]
    hints = typing.get_type_hints(DeploymentConfig)
    sections = {name: table for name, hint in hints.items()  # a table, or an optional one ([bounds])
                for table in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(table)}
    assert {re.match(r"\| `\[(\w+)\]`", row)[1] for row in rows} == set(sections)
    for row in rows:
        name = re.match(r"\| `\[(\w+)\]`", row)[1]
        declared = {f.name for f in dataclasses.fields(sections[name])}
        named = set(re.findall(r"`([a-z_0-9]+)`", row.split("|")[2]))
        values = {"auto", "float32", "bfloat16", "float16", "cpu", "cuda", "aten", "onednn", "weights", "layer_sizes",
                  "activation"}  # choices of a key, and [score] mlp_head's own keys
        assert named - values <= declared, f"[{name}] names undeclared keys: {sorted(named - values - declared)}"


def test_the_readme_stays_a_users_document_with_the_api_in_its_first_half():
    lines = README.splitlines()
    assert len(lines) <= 400, "the README grew past 400 lines: move the detail to docs/"
    api = next(i for i, line in enumerate(lines) if line.startswith("## The HTTP API"))
    assert api < len(lines) / 2
