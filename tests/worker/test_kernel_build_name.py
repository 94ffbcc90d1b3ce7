"""worker/runtime/kernels.build_name: the kernel library's build folder is one per checkout and per content,
so two checkouts building at once never rebuild each other's library under a process that loaded it."""

from __future__ import annotations

import shutil
from pathlib import Path

from worker.runtime import kernels
from worker.runtime.kernels import build_name

KERNELS = Path(kernels.__file__).parent


def checkout_of_kernels(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for source in [*KERNELS.glob("*.cpp"), *KERNELS.glob("*.h")]:
        shutil.copyfile(source, folder / source.name)
    return folder


def test_two_checkouts_of_the_same_sources_build_in_two_folders(tmp_path):
    one, other = checkout_of_kernels(tmp_path / "one"), checkout_of_kernels(tmp_path / "other")
    assert build_name(one) == build_name(one)
    assert build_name(one) != build_name(other)


def test_an_edited_source_builds_in_another_folder(tmp_path):
    folder = checkout_of_kernels(tmp_path / "k")
    before = build_name(folder)
    source = folder / "attention_parts.h"
    source.write_text(source.read_text() + "\n// edited\n")
    assert build_name(folder) != before
