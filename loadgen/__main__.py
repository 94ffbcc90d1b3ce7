"""`python -m loadgen replay|sweep|tune|validate|bound|import|synth ...`: the only place that reads argv."""

from __future__ import annotations

import sys

from loadgen import commands
from loadgen.cli import build_parser
from loadgen.trace import TraceError

HANDLERS = {
    "synth": commands.cmd_synth,
    "import": commands.cmd_import,
    "replay": commands.cmd_replay,
    "sweep": commands.cmd_sweep,
    "tune": commands.cmd_tune,
    "validate": commands.cmd_validate,
    "bound": commands.cmd_bound,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return HANDLERS[args.command](args)
    except (TraceError, ValueError, OSError, RuntimeError) as exc:
        print(f"loadgen {args.command}: error: {_message(exc)}", file=sys.stderr)
        return 2


def _message(exc: Exception) -> str:
    """One line naming the problem: a file error as `path: reason` (e.g. "t.jsonl: Is a directory")."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
