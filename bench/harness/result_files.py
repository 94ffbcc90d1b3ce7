"""One result file of bench/results/ as the report reads it: which benchmark it measured, on which machine
class, at which commit and under what load.

Machine class. A result names its machine class in `run.machine_class` when it has one. Files written
before that field existed carry the class in their name instead (`-amx`, `-avx512-halfrate`, `-avx2`:
runs on different machines were kept apart by these suffixes); a name without a suffix falls back on
the CPU features the run recorded (`run.cpu_features`: amx, else the vector ISA), and a file with
neither says `unrecorded`. `class_source` says which of these gave the class, and every rendered row
shows it, so a reader knows which classes were read from a name.

Benchmark key. Two files measure the same thing when their names agree once the machine class suffix
and the round count (`-1round`, `-3rounds`) are taken off: bench/results keeps one current file per
key and machine class (tests/bench/test_report.py checks it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLASS_SUFFIXES = ("avx512-halfrate", "amx", "avx2")
"""Machine classes a file name may end with (after `-`), longest first so none hides another."""
ROUNDS = re.compile(r"-\d+rounds?$")
SCRIPTS = tuple(sorted(path.stem for path in Path(__file__).parents[1].glob("*.py") if not path.stem.startswith("_")))
"""The benchmark scripts of bench/, whose names start the names of the files they write."""


@dataclass(frozen=True)
class ResultFile:
    """A committed result: its file name (without .json), its JSON, and the facts every row shows."""

    name: str
    data: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> ResultFile:
        return cls(path.stem, json.loads(path.read_text()))

    @property
    def run(self) -> dict[str, Any]:
        return self.data.get("run") or {}

    @property
    def bench(self) -> str:
        """The benchmark script that wrote it: its `bench` field, else the longest script name it starts with."""
        if self.data.get("bench"):
            return str(self.data["bench"])
        return max((s for s in SCRIPTS if self.name.startswith(s)), key=len, default=self.name)

    @property
    def key(self) -> str:
        """The name without its machine class suffix and round count: what it measured."""
        stem = self.name
        for suffix in CLASS_SUFFIXES:
            if stem.endswith("-" + suffix):
                stem = stem[: -len(suffix) - 1]
                break
        return ROUNDS.sub("", stem)

    @property
    def machine_class(self) -> tuple[str, str]:
        """(class, where it came from: "recorded", "file name", "CPU features" or "nothing recorded")."""
        if self.run.get("machine_class"):
            return self.run["machine_class"], "recorded"
        for suffix in CLASS_SUFFIXES:
            if self.name.endswith("-" + suffix):
                return suffix, "file name"
        features = self.run.get("cpu_features")
        if features:
            return ("amx" if features.get("amx") else str(features.get("isa", "unknown")).lower()), "CPU features"
        return "unrecorded", "nothing recorded"

    @property
    def commit(self) -> str:
        """The commit's first 7 characters, with `-dirty` when the tree differed from it."""
        commit = str(self.run.get("commit") or "unknown")
        return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")

    @property
    def date(self) -> str:
        return str(self.run.get("date") or "")

    @property
    def load_median(self) -> float | None:
        """The machine's 1-minute load average, median over the timed part (or the whole run)."""
        load = (self.run.get("load") or {}).get("load_average_1m") or {}
        return load.get("median")

    @property
    def quick(self) -> bool:
        return bool(self.data.get("quick", self.run.get("quick", False)))

    def source(self) -> str:
        """The cell every rendered row ends with: file, commit, machine class (and its source), load."""
        machine, how = self.machine_class
        load = "load not sampled" if self.load_median is None else f"load {self.load_median:g}"
        return f"`{self.name}` · {self.commit} · {machine} ({how}) · {load}"


def read_results(folder: Path) -> dict[str, ResultFile]:
    """Every result file in `folder`, by name."""
    return {path.stem: ResultFile.read(path) for path in sorted(folder.glob("*.json"))}
