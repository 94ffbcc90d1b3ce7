"""C++ kernels the CPU packages call as operators (torch.ops.boundserve.*), and their one library file.

`packed_attention.cpp`: attention over the packed key pool (compile/attention.py) in bfloat16 with
AVX512-BF16 dot products, or in float32 with FMAs, one code for both. On a CPU with AVX512-BF16 but
without AMX, FlexAttention's CPU kernel leaves its fast path in bfloat16, so those packages used to run
attention as float32 on upcast q/k/v. Measured in the compiled Qwen3-0.6B scoring node (16 query heads,
8 K/V heads of 128; one request of 15 samples, 4,285 tokens; 2 threads, an AMD EPYC with AVX512-BF16
and no AMX; bench/profile_nodes.py): attention 0.68 s of the request against 2.44 s with FlexAttention's
float32 kernel, 25 ms a layer against 90 ms. In float32 the same code replaces FlexAttention's float32
kernel, which ran at 0.24 of the float32 peak in the Qwen2.5-0.5B node (44.7 ms a layer, same request and
machine): the operator alone on that layer's shapes (14 query heads, 2 K/V heads of 64, 15 causal samples
of 285 tokens; median of 30 calls) took 15.9 ms, 0.61 of the peak; on Qwen3-0.6B's, 39.2 ms (0.56).

`packed_attention_amx.cpp`: the same attention in bfloat16 with q·k and p·v on AMX tiles (the same packed k
and v, intervals and online softmax in float32), for bfloat16 where the CPU has AMX, which ran
FlexAttention's own bfloat16 kernel before (at 0.058 of the bf16 peak in the Qwen2.5-0.5B scoring node). Its
layout of the work, where its time goes and what was tried: docs/design/attention.md; its speed alone on the
node's shapes against FlexAttention's bfloat16 kernel, measured in the same run: bench/attention_op.py
(bench/results/attention_op-<model>-bf16-amx.json, rendered in docs/benchmarks.md).

The build compiles the library (torch.utils.cpp_extension: a C++ compiler and ninja, which the
compile step has anyway) and copies it into the artifacts folder, named in the manifest with its
hash; the runtime loads that file before the packages, so serving needs no compiler. A package calls
the operator through AOTInductor's proxy executor: C++ from end to end, no Python called.

One process holds one version of the library: a second, different one is refused (its operators
would have the same names).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import torch

from worker.runtime.files import file_hash

__all__ = ["LIBRARY", "OPERATORS", "KernelMismatch", "OwnLibrary", "attention_applies", "attention_kernel",
           "build_library", "build_name", "compile_library", "library_name", "load_library"]

LIBRARY = "boundserve_kernels.so"
"""The library's file name in an artifacts folder."""

OPERATORS = ("packed_attention", "packed_attention_amx")
"""The library's operators (namespace boundserve), one signature: (q, k, v, intervals) -> out like q."""

SOURCES = tuple(Path(__file__).parent / name for name in ("packed_attention.cpp", "packed_attention_amx.cpp"))
FLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma",
         "-mamx-tile", "-mamx-bf16")
"""-fopenmp: at::parallel_for is a header template; compiled without it, it runs on one thread. The AMX flags
let packed_attention_amx.cpp use the tile intrinsics; compilers emit AMX instructions only where code asks for
them, so the library loads and the other operator runs on a CPU without AMX."""


class KernelMismatch(RuntimeError):
    """One of our libraries (OwnLibrary) that cannot be loaded into this process."""


class OwnLibrary:
    """One of our C++ libraries (the kernels, the package runner) in this process: compiled at most once,
    loaded at most once. Loading the same content again does nothing; another build raises KernelMismatch,
    since its operators or classes would be registered under the same names."""

    def __init__(self, what: str, file: str, name: Callable[[], str], sources: tuple[Path, ...],
                 flags: tuple[str, ...], after_load: Callable[[], None] = lambda: None) -> None:
        self.what, self.file, self.name, self.sources, self.flags = what, file, name, sources, flags
        self.after_load = after_load
        self._lock = threading.Lock()
        self._loaded: str | None = None  # sha256 of the build this process loaded
        self._built: Path | None = None  # the library this process compiled

    def build(self, out: Path | None = None) -> Path:
        """Compile the library (cached while its sources and flags are unchanged), load it into this process
        and, given `out`, copy it there as `file`. Returns the library's path."""
        with self._lock:
            if self._built is None:
                self._built = compile_library(self.name(), self.sources, self.flags)
        self.load(self._built)
        if out is None:
            return self._built
        target = Path(out) / self.file
        shutil.copyfile(self._built, target)
        return target

    def load(self, path: Path, digest: str | None = None) -> None:
        """Load the library at `path` into this process once; loading the same library again (the same
        content: `digest`, its sha256 where the caller has checked it, else hashed here) does nothing, a
        different one raises KernelMismatch."""
        digest = digest or file_hash(Path(path))
        with self._lock:
            if self._loaded == digest:
                return
            if self._loaded is not None:
                raise KernelMismatch(f"{path}: this process already runs another build of {self.what} "
                                     f"(sha256 {self._loaded[:12]}); one process serves artifacts of one build")
            torch.ops.load_library(str(path))
            self.after_load()
            self._loaded = digest


def attention_kernel(dtype: torch.dtype, device: torch.device, head_dim: int) -> str | None:
    """The operator (of OPERATORS) a package's attention runs, or None for FlexAttention's kernel. Only on a
    CPU with AVX512-BF16 (the library is compiled for it) and heads a multiple of 16 wide:
    - bfloat16 where the CPU has AMX and Linux lets this process use it, heads a multiple of 32 wide (an AMX
      tile row's 32 bfloat16): packed_attention_amx, q·k and p·v on the tiles; narrower heads keep
      FlexAttention's bfloat16 kernel, which also multiplies on the tiles there;
    - bfloat16 where the CPU has no AMX, and float32 on any: packed_attention (AVX512-BF16 dot products, or
      FMAs). Float32 was measured on a CPU without AMX only; FlexAttention's float32 kernel, which it
      replaces, is the same code with or without."""
    if device.type != "cpu" or head_dim % 16 or not torch.cpu._is_avx512_bf16_supported():
        return None
    if dtype == torch.float32:
        return "packed_attention"
    if dtype != torch.bfloat16:
        return None
    if not torch.cpu._is_amx_tile_supported():
        return "packed_attention"
    return "packed_attention_amx" if head_dim % 32 == 0 and torch.cpu._init_amx() else None


def attention_applies(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether a package's attention runs one of the library's operators (attention_kernel)."""
    return attention_kernel(dtype, device, head_dim) is not None


def compile_library(name: str, sources: tuple[Path, ...], flags: tuple[str, ...]) -> Path:
    """Compile `sources` into a library of torch operators or classes (not a Python module) in the
    cpp_extension build folder `name`; returns its path. cpp_extension's `load` also loads what it built,
    from its own path: it runs in a child process, so that this one loads a library only through its
    loader (`load_library`, worker/runtime/package_runner.load): the same library loaded from a second
    path would register its operators twice.

    Name the build folder by the sources' and flags' hash (build_name): cpp_extension versions a name only
    within one process, so two checkouts with different sources built the same name into one folder, and a
    process could load the other checkout's library (seen: an operator missing from it)."""
    script = ("import sys, json; from torch.utils.cpp_extension import load; a = json.loads(sys.argv[1]); "
              "print(load(name=a['name'], sources=a['sources'], extra_cflags=a['flags'], "
              "extra_ldflags=['-fopenmp'], is_python_module=False, verbose=False))")
    args = json.dumps({"name": name, "sources": [str(s) for s in sources], "flags": list(flags)})
    done = subprocess.run([sys.executable, "-c", script, args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {', '.join(s.name for s in sources)} failed; "
                           f"it needs a C++ compiler and ninja:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def build_name(folder: Path) -> str:
    """The cpp_extension build folder's name for the kernel sources in `folder`: their content, the flags
    and the folder itself. The folder counts because the build file names each source by its path: two
    checkouts of the same sources sharing one build folder rewrote each other's build file, so ninja
    rebuilt the library under a process that had just loaded it (seen as KernelMismatch while two
    checkouts built at once)."""
    sources = sorted(folder / s.name for s in SOURCES) + sorted(folder.glob("*.h"))
    return library_name("boundserve_kernels", folder, sources, FLAGS)


def library_name(prefix: str, folder: Path, sources: list[Path], flags: tuple[str, ...]) -> str:
    """`prefix` and a hash of `folder`, the sources' names and content, and the flags."""
    key = hashlib.sha256(json.dumps([str(folder.resolve())] + [[s.name, s.read_text()] for s in sources]
                                    + [list(flags)]).encode())
    return f"{prefix}_{key.hexdigest()[:16]}"


def _register_fakes() -> None:
    for operator in OPERATORS:
        torch.library.register_fake(f"boundserve::{operator}")(_packed_attention_shape)


def _packed_attention_shape(q, k, v, intervals):
    """The operator's output for tracing: q's shape and dtype."""
    return torch.empty_like(q)


_LIBRARY = OwnLibrary("the boundserve kernels", LIBRARY, lambda: build_name(Path(__file__).parent), SOURCES, FLAGS,
                      after_load=_register_fakes)
build_library = _LIBRARY.build
"""Compile the kernel library, load it and, given a folder, copy it there as LIBRARY (OwnLibrary.build)."""
load_library = _LIBRARY.load
"""Load the kernel library at a path into this process once (OwnLibrary.load)."""
