"""Where a result came from: commit, date, machine, library versions, threads, the machine's load
while it was measured; and the one writer of result files, which never writes a result whose
parity failed.

Imports neither torch nor aiohttp, so that every benchmark (including the gateway and protocol
ones that never load a model) records the same facts the same way.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
LOAD_INTERVAL_S = 1.0


class ParityFailed(SystemExit):
    """A result whose outputs disagree with their reference: not written, the run exits non-zero."""


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


def cpu_features() -> dict:
    """What decides which kernels run: the vector ISA torch dispatches to and the int8 / bfloat16 extensions (one
    "AMD EPYC" model name has covered both an AVX-512 machine with BF16 and VNNI and an AVX2-only one)."""
    import torch

    return {"isa": torch.backends.cpu.get_cpu_capability(), "vnni": torch.cpu._is_vnni_supported(),
            "avx512_bf16": torch.cpu._is_avx512_bf16_supported(), "amx": torch.cpu._is_amx_tile_supported()}


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


class LoadSampler:
    """The machine's 1-minute load average and this process's CPU use (cores busy, all its threads),
    sampled every `interval_s` on a daemon thread from start() to stop(): what the machine was doing
    while the figures were taken, not at the moment the file is written."""

    def __init__(self, interval_s: float = LOAD_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.load_1m: list[float] = []
        self.process_cores: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = (time.monotonic(), time.process_time())

    def start(self) -> LoadSampler:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        self.load_1m.append(os.getloadavg()[0])
        now = (time.monotonic(), time.process_time())
        wall, cpu = now[0] - self._last[0], now[1] - self._last[1]
        if wall > 0.05:  # the first sample, or stop() right after a sample, has no interval
            self.process_cores.append(cpu / wall)
        self._last = now

    def summary(self, over: str) -> dict[str, Any]:
        """min / median / max of each series, and what span they cover."""
        def spread(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {"min": round(min(values), 2), "median": round(statistics.median(values), 2),
                    "max": round(max(values), 2)}
        return {"over": over, "samples": len(self.load_1m), "interval_s": self.interval_s,
                "load_average_1m": spread(self.load_1m), "process_cpu_cores": spread(self.process_cores)}


_RUN = LoadSampler().start()
"""Sampled from the moment a benchmark imports its harness until it writes its result; `timed_part()`
narrows what a result reports to the part that was timed."""
_TIMED: list[LoadSampler] = []


@contextlib.contextmanager
def timed_part() -> Iterator[LoadSampler]:
    """Sample the load while the timed part runs; the result then reports that span (the last one,
    if a bench times several parts in turn: put them all inside one)."""
    sampler = LoadSampler().start()
    try:
        yield sampler
    finally:
        sampler.stop()
        _TIMED.append(sampler)


def load_during_run() -> dict[str, Any]:
    if _TIMED:
        return _TIMED[-1].summary("timed part")
    return _RUN.summary("whole run")


def provenance(quick: bool, threads: int | dict[str, int | None] | None) -> dict:
    """The facts every result JSON carries under "run"."""
    return {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_features": cpu_features(),
        "cpu_cores": os.cpu_count(),
        "threads": threads,
        "load": load_during_run(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "ctranslate2": version("ctranslate2"),
        "quick": quick,
    }


def failed_checks(result: dict) -> list[dict]:
    """The parity checks of a result that failed: each entry of result["parity"] (a list of checks,
    each with "check" and "ok") whose "ok" is false; a result that says parity_ok false counts too."""
    checks = result.get("parity") or []
    failed = [c for c in checks if not c.get("ok")]
    if not failed and result.get("parity_ok") is False:
        failed = [{"check": "parity_ok", "ok": False}]
    return failed


def write_result(name: str, result: dict, quick: bool, threads: int | dict[str, int | None] | None) -> Path:
    """Write result (plus "quick" and "run") to bench/results/<name>.json and print it as the last line.

    A result whose parity failed is printed (so the numbers can be read) but never written: this
    raises ParityFailed (exit status 1) before the file is touched. `threads`: the intra-op threads
    each side computed with (an int when every side used the same), for serving runs the worker's
    configured threads; None only where nothing computes (a protocol round trip)."""
    result = {**result, "quick": quick, "run": provenance(quick, threads)}
    text = json.dumps(result, default=str)
    failed = failed_checks(result)
    if failed:
        print(text)
        raise ParityFailed(f"parity failed ({', '.join(str(c.get('check')) for c in failed)}): nothing written "
                           f"to {RESULTS / f'{name}.json'}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(text)
    sys.stdout.flush()
    return path
