"""Facts about the machine a package is built for or runs on, and the check that they agree."""

from __future__ import annotations

import platform

import torch


class ArtifactMismatch(RuntimeError):
    """Compiled artifacts were built for another machine, device or torch version."""


def machine_facts(device: str) -> dict:
    """What a compiled package depends on: torch version, device type, CPU ISA or GPU architecture."""
    kind = device.split(":")[0]
    facts = {"torch": torch.__version__, "device": kind, "machine": platform.machine()}
    if kind == "cpu":
        facts["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
        # int8 packages quantize activations to the range this CPU's int8 dot products hold (quantize/int8.py)
        facts["cpu_vnni"] = "yes" if torch.cpu._is_vnni_supported() else "no"
        # packages may call worker/runtime/kernels' attention (built for AVX512-BF16), bfloat16 ones FlexAttention's AMX kernel
        facts["cpu_bf16"] = "yes" if torch.cpu._is_avx512_bf16_supported() else "no"
        facts["cpu_amx"] = "yes" if torch.cpu._is_amx_tile_supported() else "no"
    else:
        index = int(device.split(":")[1]) if ":" in device else 0
        major, minor = torch.cuda.get_device_capability(index)
        facts["gpu_arch"] = f"sm_{major}{minor}"
    return facts


def check_compatible(built: dict, device: str) -> None:
    """Raise ArtifactMismatch naming every fact of `built` that differs on this machine."""
    kind = device.split(":")[0]
    if built.get("device") != kind:
        raise ArtifactMismatch(
            f"artifacts were compiled for device {built.get('device')!r} but this worker runs on {kind!r}; "
            "recompile with model.device set to match"
        )
    here = machine_facts(device)
    problems = [
        f"{key}: built for {built.get(key)!r}, this machine has {here[key]!r}"
        for key in here
        if built.get(key) != here[key]
    ]
    if problems:
        raise ArtifactMismatch(
            "artifacts were compiled for another machine (" + "; ".join(problems) + "); "
            "rebuild them on this machine class with `python -m compile`"
        )


def check_threads(compiled: int | None, running: int) -> None:
    """Raise ArtifactMismatch when a CPU package compiled for `compiled` intra-op threads would run on
    more (its attention kernel's per-thread buffers are sized for the compiled count: more threads
    write past them). Fewer is safe. compiled None: a CUDA package, nothing to check."""
    if compiled is not None and running > compiled:
        raise ArtifactMismatch(
            f"the packages were compiled for {compiled} CPU thread(s) but this process runs {running}; "
            f"call torch.set_num_threads({compiled}) first, or rebuild with [worker] cpu_threads = {running}"
        )
