"""Render the README's headline table and docs/benchmarks.md's tables from bench/results/*.json.

Each rendered table sits between two marker comments in its document,

    <!-- report:begin NAME -->
    ...
    <!-- report:end NAME -->

and NAME is one of bench/report_tables.TABLES. Nothing between the markers is typed by hand: a figure
shown anywhere comes from a committed result file, so it cannot drift from what was measured.

    python bench/report.py            # rewrite the tables in place
    python bench/report.py --check    # exit 1 naming each table that differs from what the files render
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: bench/ is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.report_tables import TABLES  # noqa: E402
from bench.harness.result_files import read_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/benchmarks.md")
"""The documents whose marked tables are rendered, relative to the repository root."""
MARKED = re.compile(r"(<!-- report:begin (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- report:end (?P=name) -->)", re.S)


class ReportError(ValueError):
    """A document names a table that does not exist, or a result a table needs is missing."""


def rendered(name: str, results: dict) -> str:
    if name not in TABLES:
        raise ReportError(f"a marker names table {name!r}; the tables are: {', '.join(TABLES)}")
    try:
        return "\n".join(TABLES[name](results)) + "\n"
    except KeyError as exc:
        raise ReportError(f"table {name!r} needs {exc} from bench/results, which no committed file holds") from None


def render_text(text: str, results: dict) -> tuple[str, list[str]]:
    """`text` with every marked table rendered again, and the names of the tables that changed."""
    changed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        body = rendered(match["name"], results)
        if body != match["body"]:
            changed.append(match["name"])
        return match.group(1) + body + match.group(4)

    return MARKED.sub(replace, text), changed


def differences(root: Path = ROOT) -> list[str]:
    """`document: table` for every marked table that differs from what the result files render."""
    results = read_results(root / "bench" / "results")
    found = []
    for document in DOCUMENTS:
        _, changed = render_text((root / document).read_text(), results)
        found += [f"{document}: {name}" for name in changed]
    return found


def rewrite(root: Path = ROOT) -> list[str]:
    """Render every marked table in place; returns what changed."""
    results = read_results(root / "bench" / "results")
    found = []
    for document in DOCUMENTS:
        path = root / document
        text, changed = render_text(path.read_text(), results)
        if changed:
            path.write_text(text)
        found += [f"{document}: {name}" for name in changed]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        found = differences(args.root) if args.check else rewrite(args.root)
    except ReportError as exc:
        print(f"bench/report.py: {exc}", file=sys.stderr)
        return 2
    if args.check and found:
        print("tables that differ from bench/results (run python bench/report.py):\n  " + "\n  ".join(found),
              file=sys.stderr)
        return 1
    print("\n".join(f"rendered {what}" for what in found) or "every table is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
