"""The suite's shared compiling (tests/builds.py): processes take the builds longest first, skip one
another process holds, and leave a failing build to its tests."""

import fcntl

import pytest

from tests.builds import SUITE_BUILDS, SuiteBuild, SuiteBuilds, build_artifacts, lock_file


def test_sharing_goes_longest_first_skips_a_build_held_elsewhere_and_survives_a_failure(
        monkeypatch, tmp_path_factory, demo_checkpoint):
    made = []

    def recorder(name):
        def make(maker, folder):
            made.append(name)
            return folder
        return make

    def fails(maker, folder):
        raise RuntimeError("a broken build")

    def held(maker, folder):  # reaches the lock, which the other process holds, before any compiling
        build_artifacts(demo_checkpoint, "test-held-elsewhere")
        made.append("held")

    for name, build in {"short": SuiteBuild(recorder("short"), 1), "held": SuiteBuild(held, 9),
                        "long": SuiteBuild(recorder("long"), 5), "broken": SuiteBuild(fails, 7)}.items():
        monkeypatch.setitem(SUITE_BUILDS, name, build)
    builds = SuiteBuilds(lambda *a, **k: None, tmp_path_factory)
    lock_file("test-held-elsewhere").parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file("test-held-elsewhere"), "w") as other_process:
        fcntl.flock(other_process, fcntl.LOCK_EX)
        builds.share(["short", "held", "long", "broken"])
        assert made == ["long", "short"]
    assert builds.get("long") == builds.get("long")  # made once per process
    assert made == ["long", "short"]
    with pytest.raises(RuntimeError, match="a broken build"):  # its tests' fixture raises it again
        builds.get("broken")
