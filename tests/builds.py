"""The suite's compiled deployments: `build_artifacts` (cached across runs under .pytest_cache/boundserve/,
one build per folder at a time under a file lock) and the registry of `suite_build`s that the session
fixtures of tests/conftest.py share out between pytest processes.

A module of its own, imported as `tests.builds` by every conftest and test: pytest imports each
conftest.py under a name of its own, so state kept in tests/conftest.py would exist twice.
"""

from __future__ import annotations

import re

import contextvars
import dataclasses
import fcntl
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache" / "boundserve"


def demo(make) -> Path:
    """A tiny Qwen3 checkpoint (GQA 4:2, head_dim 24 != 64/4, untied embeddings)."""
    return make("qwen3", name="demo")


class Busy(Exception):
    """Another process holds the build's lock (raised only while sharing builds: `share_builds`)."""


_WAIT_FOR_LOCK = contextvars.ContextVar("wait_for_lock", default=True)


def lock_file(name: str) -> Path:
    """The file whose lock a build of the folder `name` holds (one build per folder at a time)."""
    return CACHE / "artifacts" / f".{name}.lock"


def build_artifacts(checkpoint: Path, name: str, config_path: str = "configs/test.toml", **sections) -> Path:
    """Compile `checkpoint` with a config from configs/, cached across runs. Each of `sections` replaces
    the config's section of that name: a section object whole, a dict only the fields it names."""
    from compile.build import build
    from shared.config import load_config

    config = load_config(ROOT / config_path)
    sections = {key: dataclasses.replace(getattr(config, key), **value) if isinstance(value, dict) else value
                for key, value in sections.items()}
    model = dataclasses.replace(sections.pop("model", config.model), path=str(checkpoint))
    config = config.replace(model=model, **sections)
    out = CACHE / "artifacts" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file(name), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if _WAIT_FOR_LOCK.get() else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Busy(name) from None
        build(config, out)
    return out


Make = Callable[..., Path]
"""checkpoint_factory's maker: make(family, name=None, **config_overrides) -> checkpoint folder."""


@dataclasses.dataclass(frozen=True)
class SuiteBuild:
    make: Callable[[Make, Path], Any]
    """(checkpoint maker, a scratch folder of its own) -> the fixture's value; compiles one deployment."""
    compile_s: int
    """Rough compile time on a 2-core machine, cold: the shared builds go longest first."""


SUITE_BUILDS: dict[str, SuiteBuild] = {}


def suite_build(compile_s: int):
    """Register `make(checkpoint_maker, folder)` as a compiled deployment of the suite, and return a session
    fixture of the same name whose value is make's (built once per process, cached across runs)."""
    def register(make: Callable[[Make, Path], Any]):
        name = make.__name__
        SUITE_BUILDS[name] = SuiteBuild(make, compile_s)

        def fixture(suite_builds):
            return suite_builds.get(name)
        fixture.__doc__ = make.__doc__
        return pytest.fixture(scope="session", name=name)(fixture)
    return register


class SuiteBuilds:
    """The values of the registered builds this process has made (session fixture `suite_builds`)."""

    def __init__(self, make: Make, tmp_path_factory) -> None:
        self._make = make
        self._tmp = tmp_path_factory
        self._values: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self._values:
            self._values[name] = SUITE_BUILDS[name].make(self._make, self._tmp.mktemp(name))
        return self._values[name]

    def share(self, names: list[str]) -> None:
        """Build `names`, longest first, skipping each that another process is building right now; a build
        that fails here is left to its tests' fixture, which raises it again where it belongs."""
        token = _WAIT_FOR_LOCK.set(False)
        try:
            for name in sorted(names, key=lambda n: -SUITE_BUILDS[n].compile_s):
                try:
                    self.get(name)
                except Busy:
                    continue
                except Exception:
                    logging.getLogger("tests").exception("the suite build %s failed; its tests will say how", name)
        finally:
            _WAIT_FOR_LOCK.reset(token)


@suite_build(compile_s=60)
def demo_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint compiled for the CPU with configs/test.toml (float32)."""
    return build_artifacts(demo(make), "demo")


INT8_GATE = {"selection_max_drift": 0.5, "max_label_logprob_drift": 1.0, "mean_label_logprob_drift": 0.5,
             "min_top1_agreement": 0.5, "min_rank_agreement": 0.5}
"""[quantize] gate limits a tiny random model passes (tests/compile/test_int8.py)."""


def build_int8(checkpoint: Path, name: str, **gate) -> Path:
    """`checkpoint` with both nodes and selective int8 under INT8_GATE (limits in `gate` replaced), its
    beam node unrolled for 3 new tokens (the int8 tests ask for 3; test.toml's 4 costs ~1/4 more compile)."""
    from shared.config import BeamConfig, QuantizeConfig, ScoreConfig

    return build_artifacts(checkpoint, name, quantize=QuantizeConfig(int8=True, **(INT8_GATE | gate)),
                           score=ScoreConfig(enabled=True), beam=BeamConfig(enabled=True),
                           bounds={"max_new_tokens": 3})


@suite_build(compile_s=230)
def int8_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint with both nodes and selective int8 (build_int8), built once for the session:
    every int8 test reads this one build (the build, not the tests, is the costly part)."""
    return build_int8(demo(make), "demo-int8")


@suite_build(compile_s=190)
def beam_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint compiled with both nodes, scoring and beam search (sharing one weights file), its
    linears on prepacked oneDNN (`[model] gemm = "onednn"`) on every CPU: the suite's prepacked build
    where "auto" keeps aten (AVX2 alone; compile/linear.py)."""
    from shared.config import BeamConfig, ScoreConfig

    return build_artifacts(demo(make), "beam", model={"gemm": "onednn"}, score=ScoreConfig(enabled=True),
                           beam=BeamConfig(enabled=True))


STATIC_TEMPLATE = "You rate how well an item fits the user. Answer yes or no.\nUser: {query}\nItem: {text}"
"""A prompt template whose header (before the first placeholder) the scoring node holds as a static prefix."""


@suite_build(compile_s=75)
def static_template_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint compiled with [score] prompt_template = STATIC_TEMPLATE."""
    from shared.config import ScoreConfig

    return build_artifacts(demo(make), "demo-static", score=ScoreConfig(prompt_template=STATIC_TEMPLATE))


@suite_build(compile_s=60)
def bf16_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint compiled in bfloat16 (heads 24 wide: FlexAttention's attention on every CPU)."""
    return build_artifacts(demo(make), "demo-bf16", model={"dtype": "bfloat16"})


def kernel_checkpoint(make) -> Path:
    """demo_checkpoint's shape with heads 32 wide, which worker/runtime/kernels' bfloat16 attention takes."""
    return make("qwen3", name="demo-hd32", head_dim=32)


@suite_build(compile_s=190)
def bf16_kernel_artifacts(make: Make, folder: Path) -> Path:
    """kernel_checkpoint compiled in bfloat16 with both nodes: their attention (the beam node's prefill)
    is worker/runtime/kernels' operator on a CPU with AVX512-BF16 (packed_attention_amx where it has AMX:
    worker/runtime/kernels.attention_kernel), FlexAttention's elsewhere."""
    from shared.config import BeamConfig, ScoreConfig

    return build_artifacts(kernel_checkpoint(make), "demo-hd32-bf16", model={"dtype": "bfloat16"},
                           score=ScoreConfig(enabled=True), beam=BeamConfig(enabled=True))


def semantic_ids(seed: int, count: int, length: int, alphabet=range(3, 60)) -> list[list[int]]:
    """`count` random id sequences of `length` tokens (generative retrieval's item ids), duplicates possible."""
    rng = random.Random(seed)
    return [[rng.choice(alphabet) for _ in range(length)] for _ in range(count)]


def write_sequences(path: Path, valid: list[list[int]]) -> Path:
    """A sequences file of `valid` (one id list per line), as `[beam] constraints` reads it."""
    path.write_text("\n".join(" ".join(map(str, s)) for s in valid))
    return path


VALID = semantic_ids(1, 300, 3) + semantic_ids(2, 20, 2)
"""The constrained build's first catalogue (3 and 2 tokens), loaded at start ([beam] constraints)."""
CATALOG_BOUNDS = {"max_catalog_nodes": 2048, "max_catalog_fanout": 64}
"""constrained_beam_artifacts' table sizes: room for two catalogues like VALID."""


@suite_build(compile_s=150)
def constrained_beam_artifacts(make: Make, folder: Path) -> Path:
    """demo_checkpoint's beam node alone, taking catalogue tables of CATALOG_BOUNDS' size as inputs, unrolled
    for 3 new tokens (the longest valid sequence; test.toml's 4 would unroll one more step, ~1/4 more
    compile time). Its config names VALID as the catalogue to load at start (the build only checks it fits)."""
    from shared.config import BeamConfig, ScoreConfig

    file = write_sequences(folder / "valid.txt", VALID)
    return build_artifacts(demo(make), "beam-constrained", score=ScoreConfig(enabled=False),
                           beam=BeamConfig(enabled=True, constraints=str(file), **CATALOG_BOUNDS),
                           bounds={"max_new_tokens": 3})


def without_bounds(toml_text: str) -> str:
    """A config's TOML without its [bounds] table: a gateway or worker then serves whatever its artifacts
    were compiled for (a config whose [bounds] differ from them is refused). The suite's builds narrow
    some bounds, and its deployment checks serve configs/*.toml on the suite's small builds."""
    return re.sub(r"(?ms)^\[bounds\]\n.*?(?=^\[|\Z)", "", toml_text)
