"""One side of an A/B benchmark in a process of its own, on its own tree (bench/node_ab.py,
bench/request_decode.py): it is asked one line at a time on stdin and answers one JSON line on stdout,
so both sides run the same calls interleaved while each imports only its tree's packages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


class SideProcess:
    """`argv` run in `tree` with the tree first on PYTHONPATH; its first JSON line is `ready`."""

    def __init__(self, name: str, tree: Path, argv: list[str]) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(argv, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self.ready: dict = self._read()

    def ask(self, line: str) -> dict:
        """The side's answer to one request line."""
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"side {self.name} exited with {self.process.wait()} (its stderr is above)")
        return json.loads(line)
