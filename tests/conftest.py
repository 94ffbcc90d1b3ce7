"""Session fixtures: tiny checkpoints written by transformers, and compiled artifacts built once.

Compiled artifacts (tests/builds.py) live under .pytest_cache/boundserve/ and are rebuilt only when
their build key (checkpoint content, config, torch, machine, compile/ sources) changes, so reruns skip
the compile. A file lock keeps concurrent test runs from building the same folder twice.

Every compiled deployment of the suite is a `suite_build`: a session fixture that also sits in one
registry. Run on several processes (`make test`: pytest-xdist), each process first compiles, longest
first, the registered builds its collected tests use that no other process is compiling at that
moment, and only then runs tests: the processes share the compiling (the suite's main cost) instead
of one waiting on another's lock, test after test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.builds import (  # noqa: F401 (the registered builds are session fixtures)
    SUITE_BUILDS,
    SuiteBuilds,
    beam_artifacts,
    bf16_artifacts,
    bf16_kernel_artifacts,
    constrained_beam_artifacts,
    demo,
    demo_artifacts,
    int8_artifacts,
    static_template_artifacts,
)

# Every property test draws the same examples on every run and every machine, CI included: a failure
# is found again by whoever reruns it, and no run passes by the luck of its draw. (No deadline: a
# loaded machine makes an example slow, not wrong.) tests/test_layering.py keeps it that way.
settings.register_profile("boundserve", derandomize=True, database=None, deadline=None)
settings.load_profile("boundserve")


def pytest_configure(config):
    """The session runs on the thread count its packages are compiled for (configs/test.toml's
    [worker] cpu_threads = 1): a CPU package refuses to run on more threads than it was built for."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    from compile.demo import train_tokenizer

    return train_tokenizer()


@pytest.fixture(scope="session")
def checkpoint_factory(tokenizer, tmp_path_factory):
    """make(family, name=None, **config_overrides) -> folder of a transformers-written checkpoint."""
    from compile.demo import write_checkpoint

    made: dict[str, Path] = {}

    def make(family: str = "qwen3", name: str | None = None, **overrides) -> Path:
        name = name or f"{family}-" + "-".join(f"{k}={v}" for k, v in sorted(overrides.items()))
        if name not in made:
            folder = tmp_path_factory.mktemp("ckpt") / name
            made[name] = write_checkpoint(folder, family, tokenizer, **overrides)
        return made[name]

    return make


@pytest.fixture(scope="session")
def demo_checkpoint(checkpoint_factory) -> Path:
    """demo(): the checkpoint most of the suite runs on."""
    return demo(checkpoint_factory)


@pytest.fixture(scope="session")
def suite_builds(checkpoint_factory, tmp_path_factory) -> SuiteBuilds:
    return SuiteBuilds(checkpoint_factory, tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def share_builds(request, suite_builds) -> None:
    """On more than one pytest-xdist process: first the builds this session's tests use (see the module
    docstring). On one process each build waits for its first test, so running one test compiles one."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return
    used = {name for item in request.session.items for name in item.fixturenames if name in SUITE_BUILDS}
    suite_builds.share(sorted(used))


