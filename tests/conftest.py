"""Session fixtures: tiny checkpoints written by transformers, and compiled artifacts built once.

Compiled artifacts live under .pytest_cache/boundserve/ and are rebuilt only when their build key
(checkpoint content, config, torch, machine, compile/ sources) changes, so reruns skip the compile.
A file lock keeps concurrent test runs from building the same folder twice.
"""

from __future__ import annotations

import dataclasses
import fcntl
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache" / "boundserve"

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
    """A tiny Qwen3 checkpoint (GQA 4:2, head_dim 24 != 64/4, untied embeddings)."""
    return checkpoint_factory("qwen3", name="demo")


def build_artifacts(checkpoint: Path, name: str, config_path: str = "configs/test.toml", **sections) -> Path:
    """Compile `checkpoint` with a config from configs/ (sections replaced), cached across runs."""
    from compile.build import build
    from shared.config import load_config

    config = load_config(ROOT / config_path)
    model = dataclasses.replace(config.model, path=str(checkpoint), **sections.pop("model", {}))
    config = config.replace(model=model, **sections)
    out = CACHE / "artifacts" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build(config, out)
    return out


@pytest.fixture(scope="session")
def demo_artifacts(demo_checkpoint) -> Path:
    """demo_checkpoint compiled for the CPU with configs/test.toml (float32)."""
    return build_artifacts(demo_checkpoint, "demo")


INT8_GATE = {"selection_max_drift": 0.5, "max_label_logprob_drift": 1.0, "mean_label_logprob_drift": 0.5,
             "min_top1_agreement": 0.5, "min_rank_agreement": 0.5}
"""[quantize] gate limits a tiny random model passes (tests/compile/test_int8.py)."""


def build_int8(checkpoint: Path, name: str, **gate) -> Path:
    """`checkpoint` with both nodes and selective int8 under INT8_GATE (limits in `gate` replaced)."""
    from shared.config import BeamConfig, QuantizeConfig, ScoreConfig

    return build_artifacts(checkpoint, name, quantize=QuantizeConfig(int8=True, **(INT8_GATE | gate)),
                           score=ScoreConfig(enabled=True), beam=BeamConfig(enabled=True))


@pytest.fixture(scope="session")
def int8_artifacts(demo_checkpoint) -> Path:
    """demo_checkpoint with both nodes and selective int8 (build_int8), built once for the session:
    every int8 test reads this one build (the build, not the tests, is the costly part)."""
    return build_int8(demo_checkpoint, "demo-int8")


@pytest.fixture(scope="session")
def beam_artifacts(demo_checkpoint) -> Path:
    """demo_checkpoint compiled with both nodes, scoring and beam search (sharing one weights file)."""
    from shared.config import BeamConfig, ScoreConfig

    return build_artifacts(demo_checkpoint, "beam", score=ScoreConfig(enabled=True), beam=BeamConfig(enabled=True))
