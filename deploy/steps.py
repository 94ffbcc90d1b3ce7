"""A long check as named steps: each printed when it starts and ends with its wall time; commands logged.

Every command a step runs is printed (`$ ...`) and its output goes to that step's log file, so the
terminal shows what was done and how long it took while the full output stays on disk; a failing
command raises StepFailed with the end of its output.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

TAIL_CHARS = 4000


class StepFailed(RuntimeError):
    """A step could not do its job; the message says what and shows the evidence."""


@dataclass
class Step:
    name: str
    log_path: Path
    seconds: float = 0.0
    ok: bool = False
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """A fact worth the summary (an image reused, a port chosen); printed at once."""
        self.notes.append(text)
        print(f"    {text}", flush=True)


class Steps:
    """Owns the log folder; `with steps.step(name):` times a step, `steps.run(argv)` runs a command in it."""

    def __init__(self, log_dir: Path, prefix: str) -> None:
        self.log_dir = log_dir
        self.prefix = prefix
        self.done: list[Step] = []
        self._current: Step | None = None
        self._started = time.monotonic()
        log_dir.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def step(self, name: str) -> Iterator[Step]:
        number = len(self.done) + 1
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        current = Step(name, self.log_dir / f"{number:02d}-{slug}.log")
        self._current = current
        print(f"[{self.prefix}] {number:2d}. {name}", flush=True)
        started = time.monotonic()
        try:
            yield current
            current.ok = True
        finally:
            current.seconds = time.monotonic() - started
            self.done.append(current)
            self._current = None
            verdict = "done" if current.ok else "FAILED"
            print(f"[{self.prefix}]     {verdict} in {current.seconds:.1f} s", flush=True)

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
            check: bool = True, echo: bool = True) -> subprocess.CompletedProcess:
        """Run argv (env: extra variables), output to the step's log; StepFailed on error or timeout."""
        log_path = self._current.log_path if self._current else self.log_dir / "commands.log"
        if echo:
            print(f"    $ {shlex.join(argv)}", flush=True)
        with open(log_path, "a") as log:
            log.write(f"\n$ {shlex.join(argv)}\n")
            log.flush()
            try:
                result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
                                        env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise StepFailed(f"`{shlex.join(argv)}` ran past {timeout_s:.0f} s; its output:\n"
                                 f"{tail(log_path)}") from None
            except FileNotFoundError:
                raise StepFailed(f"`{argv[0]}` is not installed") from None
        if check and result.returncode != 0:
            raise StepFailed(f"`{shlex.join(argv)}` exited with {result.returncode}; its output "
                             f"({log_path}):\n{tail(log_path)}")
        return result

    def output(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
        """stdout of a short query command (not echoed); StepFailed with its stderr when it fails."""
        returncode, stdout, stderr = self.capture(argv, timeout_s, env)
        if returncode != 0:
            raise StepFailed(f"`{shlex.join(argv)}` exited with {returncode}: {stderr.strip()[-TAIL_CHARS:]}")
        return stdout

    def capture(self, argv: list[str], timeout_s: float,
                env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of a short command, not echoed; StepFailed only on a timeout."""
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                    env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise StepFailed(f"`{shlex.join(argv)}` ran past {timeout_s:.0f} s") from None
        except FileNotFoundError:
            raise StepFailed(f"`{argv[0]}` is not installed") from None
        return result.returncode, result.stdout, result.stderr

    def summary(self) -> str:
        total_s = time.monotonic() - self._started
        width = max((len(s.name) for s in self.done), default=4)
        lines = [f"[{self.prefix}] step times:"]
        for number, step in enumerate(self.done, 1):
            verdict = "ok" if step.ok else "FAILED"
            lines.append(f"  {number:2d}. {step.name:<{width}}  {step.seconds:7.1f} s  {verdict}")
        lines.append(f"  wall time {total_s:.1f} s ({total_s / 60:.1f} min); logs in {self.log_dir}")
        return "\n".join(lines)


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"
