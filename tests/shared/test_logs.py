"""shared/logs.py: a process's main() writes JSON lines to stderr while it runs and leaves the root logger as it
found it, so a main() called in a test leaves no handler on that test's captured (then closed) stderr."""

import io
import logging
import sys

import pytest

from gateway.__main__ import main as gateway_main
from worker.__main__ import main as worker_main

MAINS = {"gateway": gateway_main, "worker": worker_main}


def refused(name: str, tmp_path) -> int:
    """The process's main() on a config that does not exist: it logs its refusal and returns 2."""
    return MAINS[name](["--config", str(tmp_path / "missing.toml"), "--artifacts", str(tmp_path)])


@pytest.mark.parametrize("name", MAINS)
def test_a_main_writes_its_refusal_as_a_json_line_and_leaves_the_loggers_as_it_found_them(name, tmp_path, capsys):
    root, access = logging.getLogger(), logging.getLogger("aiohttp.access")
    before = (root.handlers[:], root.level, access.level)
    assert refused(name, tmp_path) == 2
    assert "missing.toml" in capsys.readouterr().err.splitlines()[-1]
    assert (root.handlers, root.level, access.level) == before


@pytest.mark.parametrize("name", MAINS)
def test_a_record_logged_after_a_main_whose_stderr_was_closed_is_no_logging_error(name, tmp_path, capsys, monkeypatch):
    """The flake of tests/loadgen/test_loadgen_cli_errors.py: a main() run under one test's stderr, a record
    logged later (an event loop's complaint at garbage collection) while another test's stderr is current."""
    earlier = io.StringIO()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", earlier)
        assert refused(name, tmp_path) == 2
    earlier.close()  # as pytest closes a test's captured stream when the test ends
    logging.getLogger("asyncio").error("Task was destroyed but it is pending!")
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
