"""The layering of ../shared/STYLE.md, enforced: which package may import what."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules it must never import (statically, anywhere in its files)
FORBIDDEN = {
    "shared": {"torch", "aiohttp", "transformers", "gateway", "worker", "compile", "loadgen"},
    "gateway": {"torch", "transformers", "worker", "compile"},
    "worker": {"aiohttp", "gateway", "loadgen"},
    "compile": {"aiohttp", "gateway", "worker", "loadgen"},
    "loadgen": {"torch", "transformers", "worker", "compile"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_layering(package):
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_modules(path) & FORBIDDEN[package]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(bad))}")
    assert not offenders, "layering violated:\n" + "\n".join(offenders)


def test_no_bare_import_of_compile_package():
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert all(a.name != "compile" for a in node.names), f"{path}: bare `import compile`"


@pytest.mark.parametrize("package", ["gateway", "shared", "loadgen"])
def test_importing_every_module_never_loads_torch(package):
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in sorted((ROOT / package).rglob("*.py"))
        if p.name != "__main__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "loaded = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
