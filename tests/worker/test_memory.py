"""worker/memory.py: the resident limit a CPU worker holds (configured, or a share of the memory its
cgroup or machine gives it) and the release after a batch that passes it, on this process's real heap."""

from __future__ import annotations

import logging
import sys

import pytest

from shared.logs import EventLog
from worker.memory import DEFAULT_SHARE, MIB, ResidentLimit, memory_available_to_process, resident_limit

MEMINFO = "MemTotal:       24683784 kB\nMemFree:         1000000 kB\n"
TOTAL = 24683784 * 1024


@pytest.fixture
def files(tmp_path):
    def write(name: str, text: str | None) -> str:
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        return str(path)
    return write


def test_a_cgroup_limit_below_the_machine_is_the_memory_available(files):
    assert memory_available_to_process(files("meminfo", MEMINFO), (files("v2", "4294967296\n"),)) == 4 << 30


def test_no_cgroup_limit_leaves_the_machine_memory(files):
    meminfo = files("meminfo", MEMINFO)
    assert memory_available_to_process(meminfo, (files("v2", "max\n"),)) == TOTAL
    assert memory_available_to_process(meminfo, (files("absent", None), files("v1", "9223372036854771712\n"))) == TOTAL
    assert memory_available_to_process(meminfo, (files("absent", None),)) == TOTAL


def test_nothing_readable_gives_no_figure(files):
    assert memory_available_to_process(files("absent", None), (files("also-absent", None),)) is None


def test_the_limit_is_the_setting_or_a_share_of_what_the_process_may_use():
    assert resident_limit(512) == 512 * MIB
    assert resident_limit(0) is None  # never release
    available = memory_available_to_process()
    assert resident_limit(None) == (int(DEFAULT_SHARE * available) if available else None)


@pytest.fixture
def events(caplog):
    caplog.set_level(logging.INFO, logger="worker-memory-test")
    return lambda: [(r.getMessage(), r.fields) for r in caplog.records if r.name == "worker-memory-test"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the resident set is read from /proc")
def test_over_the_limit_a_batch_is_followed_by_a_release_and_the_next_waits_for_more(events):
    limit = ResidentLimit(1 * MIB, EventLog("worker-memory-test"))  # this process holds more than 1 MiB
    assert limit.after_batch() is True
    ((event, fields),) = events()
    assert event == "memory_released" and fields["limit_mb"] == 1
    assert 0 < fields["resident_mb_after"] <= fields["resident_mb_before"]
    assert limit.threshold >= 1.25 * fields["resident_mb_after"] * MIB
    assert limit.after_batch() is False  # nothing grew by a quarter since
    assert len(events()) == 1


def test_under_the_limit_nothing_is_released(events):
    assert ResidentLimit(1 << 50, EventLog("worker-memory-test")).after_batch() is False
    assert events() == []
