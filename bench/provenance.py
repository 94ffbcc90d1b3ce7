"""Where a result came from: commit, date, machine, library versions; and the one writer of result files.

Imports neither torch nor aiohttp, so that every benchmark (including the gateway and protocol
ones that never load a model) records the same facts the same way.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def git_commit() -> str:
    """HEAD's hash, with "-dirty" when tracked files outside bench/results differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return commit + ("-dirty" if changed else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def provenance(quick: bool, threads: int | None = None) -> dict:
    """The facts every result JSON carries under "run"."""
    return {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "threads": threads,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "ctranslate2": version("ctranslate2"),
        "quick": quick,
    }


def write_result(name: str, result: dict, quick: bool, threads: int | None = None) -> Path:
    """Write result (plus "quick" and "run") to bench/results/<name>.json and print it as the last line."""
    result = {**result, "quick": quick, "run": provenance(quick, threads)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, default=str))
    return path
