"""CPU packages called without holding the GIL: a small C++ library of ours that loads and runs them.

torch 2.13's package loader (torch._inductor.aoti_load_package) holds the GIL for the whole of a CPU run
(bench/cpu_lanes.py measured it). While a batch computed, the worker's receiving thread could neither read
the next batch nor decode it nor forward an answer: a batch sent during another's compute was read only
once that compute ended, so the worker's queue time missed its wait and the gateway learnt the wait as
per-batch overhead (docs/design/scheduling.md). The library's PackageRunner (package_runner.cpp) is a
TorchScript custom class around torch's C++ package loader; torch releases the GIL for a custom class's
method calls, so a run computes while the worker's Python threads go on.

The build compiles it (torch.utils.cpp_extension, with no instruction-set flags: it is glue, so it loads
on any CPU) and copies it into a CPU build's artifacts folder, named in the manifest (`runner`) with its
hash; the worker loads it before the packages, so serving needs no compiler. CUDA packages keep torch's
loader: there a call only enqueues work on a stream. A folder built before the runner existed loads
with torch's loader, as before.

One process holds one build of the library: a second, different one is refused (its class would have the
same name).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from worker.runtime.kernels import OwnLibrary, library_name

__all__ = ["LIBRARY", "RunnerPackage", "build", "load"]

LIBRARY = "boundserve_runner.so"
"""The library's file name in an artifacts folder."""

SOURCES = (Path(__file__).with_name("package_runner.cpp"),)
FLAGS = ("-O2",)

_LIBRARY = OwnLibrary("the package runner", LIBRARY, lambda: library_name("boundserve_runner", SOURCES[0].parent,
                                                                          list(SOURCES), FLAGS), SOURCES, FLAGS)
build = _LIBRARY.build
"""Compile the runner library, load it and, given a folder, copy it there as LIBRARY (OwnLibrary.build)."""
load = _LIBRARY.load
"""Load the runner library at a path into this process once (OwnLibrary.load)."""


class RunnerPackage:
    """An AOTInductor package run through the library's PackageRunner, with the part of torch's
    AOTICompiledModel that worker/runtime uses: a call on positional tensors, get_constant_fqns and
    load_constants. `runners`: calls that can run at once (one per calling thread); `device_index`: -1
    for the CPU."""

    def __init__(self, path: Path, runners: int = 1, device_index: int = -1) -> None:
        self._runner = torch.classes.boundserve_runner.PackageRunner(str(path), runners, device_index)
        inputs, outputs = self._runner.call_spec()
        self._inputs, self._outputs = pytree.treespec_loads(inputs), pytree.treespec_loads(outputs)

    def __call__(self, *args: torch.Tensor):
        flat = pytree.tree_leaves((args, {}))
        if len(flat) != self._inputs.num_leaves or not all(isinstance(t, torch.Tensor) for t in flat):
            raise TypeError(f"the package takes {self._inputs.num_leaves} tensors, was given {len(flat)} values")
        return pytree.tree_unflatten(self._runner.run(flat), self._outputs)

    def get_constant_fqns(self) -> list[str]:
        return self._runner.constant_fqns()

    def load_constants(self, constants: dict[str, torch.Tensor], *, check_full_update: bool,
                       user_managed: bool = False) -> None:
        self._runner.load_constants(constants, check_full_update, user_managed)
