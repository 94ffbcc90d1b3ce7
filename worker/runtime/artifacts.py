"""An artifacts folder on disk: the manifest, file hashes, the shared weights and package loading.

Both the build chain (which writes a folder) and the runtime (which loads one) use this module, so
a worker reads artifacts without importing the build chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from worker.runtime import kernels, package_runner
from worker.runtime.files import file_hash
from worker.runtime.machine import ArtifactMismatch
from worker.runtime.packing import pack
from shared.manifest import FORMAT_VERSION, MANIFEST, KernelLibrary, Manifest, ManifestError
from shared.manifest import read_manifest as read_shared

__all__ = ["FORMAT_VERSION", "MANIFEST", "WEIGHTS", "file_hash", "load_kernels", "load_package", "load_runner",
           "load_weights", "read_manifest"]

WEIGHTS = "weights.safetensors"


def read_manifest(folder: Path) -> Manifest:
    """shared/manifest.py's reader; a missing or broken manifest is ArtifactMismatch here."""
    try:
        manifest = read_shared(folder)
    except ManifestError as exc:
        raise ArtifactMismatch(str(exc)) from None
    if manifest.format_version != FORMAT_VERSION:
        raise ArtifactMismatch(f"{folder}: artifacts of format {manifest.format_version}, this runtime reads "
                               f"format {FORMAT_VERSION}; rebuild them with `python -m compile`")
    return manifest


def load_weights(folder: Path, manifest: Manifest, device: str) -> dict[str, torch.Tensor]:
    """The one weights file every node of the folder shares, checked against its hash; the weights
    the manifest lists under `prepacked` are packed into their kernel's layout once, here."""
    if manifest.weights is None:
        raise ArtifactMismatch(f"{folder / MANIFEST}: names no weights file; build the artifacts with `python -m compile`")
    weights_file = folder / manifest.weights.file
    if file_hash(weights_file) != manifest.weights.sha256:
        raise ArtifactMismatch(f"{weights_file}: content does not match the manifest's hash")
    return pack({k: v.to(device) for k, v in load_file(weights_file).items()}, manifest.prepacked)


def load_kernels(folder: Path, library: KernelLibrary) -> None:
    """The folder's kernel library (worker/runtime/kernels), checked against its hash, loaded into this process."""
    _load_checked(folder / library.file, library.sha256, kernels.load_library)


def load_runner(folder: Path, library: KernelLibrary) -> None:
    """The folder's package runner library (worker/runtime/package_runner.py), checked against its hash,
    loaded into this process."""
    _load_checked(folder / library.file, library.sha256, package_runner.load)


def _load_checked(path: Path, sha256: str, load: Callable[[Path, str], None]) -> None:
    try:
        if file_hash(path) != sha256:
            raise ArtifactMismatch(f"{path}: content does not match the manifest's hash")
        load(path, sha256)
    except (kernels.KernelMismatch, OSError) as exc:
        raise ArtifactMismatch(str(exc)) from None


def load_package(path: Path, sha256: str, weights: dict[str, torch.Tensor], device: str, runners: int = 1,
                 through_runner: bool = False):
    """An AOTInductor package whose constants are `weights`' tensors themselves (no copy), able to run
    `runners` calls at once (one per thread calling it; a further call waits for a free runner).
    `through_runner`: run it through package_runner's library (loaded before: load_runner), whose calls
    release the GIL; else through torch's loader."""
    from torch._inductor.package import load_package as load_aoti

    if file_hash(path) != sha256:
        raise ArtifactMismatch(f"{path}: content does not match the manifest's hash")
    index = torch.device(device).index
    index = -1 if index is None else index
    if through_runner:
        package = package_runner.RunnerPackage(path, runners, index)
    else:
        package = load_aoti(str(path), num_runners=runners, device_index=index)
    names = package.get_constant_fqns()
    missing = sorted(set(names) - set(weights))
    if missing:
        raise ArtifactMismatch(f"{path}: weights file lacks constants {missing[:5]}")
    # user_managed: the package uses our tensors in place, so every node shares one copy.
    package.load_constants({n: weights[n] for n in names}, check_full_update=True, user_managed=True)
    return package
