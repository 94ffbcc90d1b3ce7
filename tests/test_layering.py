"""The layering CONTRIBUTING.md describes, enforced: which package may import what, and no import cycle."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> modules it must never import (statically, anywhere in its files): a top-level package,
# or a dotted prefix. The offline build may use the runtime it builds for (worker.runtime: to load kernels
# and check what it built), never the rest of the worker; the runtime never imports the build chain.
FORBIDDEN = {
    "shared": {"torch", "aiohttp", "transformers", "gateway", "worker", "compile", "loadgen"},
    "gateway": {"torch", "transformers", "worker", "compile", "loadgen"},
    "worker": {"aiohttp", "gateway", "loadgen", "transformers", "compile"},
    "compile": {"aiohttp", "gateway", "loadgen"},
    "loadgen": {"torch", "transformers", "worker", "compile", "gateway"},
    "bench": {"tests"},
}
# What a package may import of a package FORBIDDEN does not name, spelled out where only part is allowed.
ONLY_PART = {"compile": {"worker": "worker.runtime"}}
# The contracts of shared/ (the wire, config, bounds, work sizes, manifest) are what the policy reads:
# they never import it.
CONTRACTS_FREE_OF = "shared.policy"

# Import machinery that would hide an import from the checks above (bench reads package versions
# through importlib.metadata; its only rule is never to import the tests).
DYNAMIC_IMPORTS = {"importlib", "__import__", "imp"}
DYNAMIC_IMPORTS_CHECKED = {package: set() if package == "bench" else DYNAMIC_IMPORTS for package in FORBIDDEN}


def imported_names(path: Path) -> set[str]:
    """Dotted modules a file imports (`from a.b import c` gives a.b and a.b.c), plus any dynamic-import
    machinery it names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Name) and node.id == "__import__":
            names.add("__import__")
    return names


def imported_modules(path: Path) -> set[str]:
    """Top-level modules a file imports, plus any dynamic-import machinery it names."""
    return {name.split(".")[0] for name in imported_names(path)}


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _violations(package: str, path: Path) -> set[str]:
    names = imported_names(path)
    bad = {n.split(".")[0] for n in names} & (FORBIDDEN[package] | DYNAMIC_IMPORTS_CHECKED[package])
    for top, allowed in ONLY_PART.get(package, {}).items():
        bad |= {n for n in names if n.split(".")[0] == top and n != allowed and not n.startswith(allowed + ".")}
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_layering(package):
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _violations(package, path)
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(bad))}")
    assert not offenders, "layering violated:\n" + "\n".join(offenders)


def test_shared_contracts_import_no_policy():
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for path in sorted((ROOT / "shared").rglob("*.py")) if "policy" not in path.parts
                 for name in sorted(imported_names(path)) if name.startswith(CONTRACTS_FREE_OF)]
    assert not offenders, "a contract depends on the policy:\n" + "\n".join(offenders)


def _import_graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports (at module level or inside functions alike)."""
    files = {_module_of(p): p for package in CODE for p in sorted((ROOT / package).rglob("*.py"))}
    graph = {}
    for module, path in files.items():
        targets = set()
        for name in imported_names(path):
            while name and name not in files:  # `from a.b import c` names a.b.c, a function of a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """No two modules of the project import each other, directly or around a loop (a function-local or
    TYPE_CHECKING import counts too: it hides a cycle, it does not remove it). A package's __init__
    re-exporting its own modules is not a cycle with them."""
    graph = _import_graph()
    for module, targets in graph.items():
        if ROOT.joinpath(*module.split(".")).is_dir():  # a package __init__: its own submodules are its parts
            graph[module] = {t for t in targets if not t.startswith(module + ".")}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_layering_checks_can_fail(tmp_path):
    """A compile module reaching past the runtime, a contract importing the policy, and a loop of two
    modules are each found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from worker.server import serve\nfrom worker.runtime.loader import load_nodes\n")
    assert _violations("compile", bad) == {"worker.server", "worker.server.serve"}
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


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


def test_the_checks_see_dynamic_imports(tmp_path):
    tricky = tmp_path / "tricky.py"
    tricky.write_text("import importlib\nmod = importlib.import_module('torch')\nt = __import__('torch')\n")
    assert {"importlib", "__import__"} <= imported_modules(tricky)


def test_a_worker_never_loads_transformers_or_the_build_chain():
    """The worker's whole import graph (worker.runtime.loader and the nodes) stays clear of transformers
    and of the offline build chain (export, AOTInductor compile, FP8 calibration)."""
    code = (
        "import sys\n"
        "import worker.__main__, worker.server, worker.startup, worker.runtime.loader\n"
        "bad = sorted(m for m in ('transformers', 'compile.build', 'compile.fp8', 'aiohttp') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _test_files() -> list[Path]:
    return sorted((ROOT / "tests").rglob("*.py"))


def test_every_property_test_is_derandomized():
    """tests/conftest.py loads a profile that derandomizes every Hypothesis test; no test may take
    that back (derandomize=False, its own seed or profile), so CI replays what a local run drew."""
    from hypothesis import settings

    assert settings.default.derandomize and settings.default.database is None
    offenders = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "derandomize" and not (
                    isinstance(node.value, ast.Constant) and node.value.value is True):
                offenders.append(f"{path.relative_to(ROOT)}:{node.value.lineno} sets derandomize")
            elif isinstance(node, ast.Attribute) and node.attr in ("seed", "load_profile", "register_profile") \
                    and path.name != "conftest.py" and ast.unparse(node.value) in ("hypothesis", "settings"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and node.module == "hypothesis" and any(
                    a.name == "seed" for a in node.names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports hypothesis.seed")
    assert not offenders, "\n".join(offenders)


def test_the_tests_hold_no_measurement_scripts():
    """A timing that is only printed cannot fail and leaves no record: measurements are benchmarks
    (bench/, a JSON result with its provenance), never scripts among the tests."""
    def is_script(path: Path) -> bool:
        return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in
                   ast.unparse(node.test) for node in ast.walk(ast.parse(path.read_text())))

    scripts = [str(p.relative_to(ROOT)) for p in _test_files() if is_script(p)]
    assert not scripts, scripts


# ---- One vocabulary: each concept has one home (issue 22) --------------------------------------

CODE = ("shared", "gateway", "worker", "compile", "loadgen", "bench")
TOKEN_COUNTS = {"sent_tokens", "computed_tokens", "cached_tokens", "prompt_tokens", "reused_tokens"}
MANIFEST_KEYS = {"bounds", "nodes", "model", "machine", "weights", "fp8", "name", "build_key", "dtype"}


def _code_files(skip: str) -> list[tuple[str, ast.AST]]:
    files = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name != skip:
                files.append((name, ast.parse(path.read_text(), filename=name)))
    return files


def _named(node: ast.AST) -> str:
    """The last name of a Name or Attribute (`self.manifest` -> manifest), else ""."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _adds_a_prefix_to_a_sum(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _named(node.left).endswith("prefix_len")
            and isinstance(node.right, ast.Call) and _named(node.right.func) == "sum")


def test_only_shared_work_counts_a_requests_tokens():
    """What a request sends, computes, reuses and reports cached is WorkSize's answer (shared/work.py):
    nobody else defines those counts, adds a prefix to its suffixes, or builds a ScoreShape by hand."""
    offenders = []
    for name, tree in _code_files(skip="shared/work.py"):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in TOKEN_COUNTS:
                offenders.append(f"{name}:{node.lineno} defines {node.name}")
            elif _adds_a_prefix_to_a_sum(node):
                offenders.append(f"{name}:{node.lineno} adds a prefix length to a sum of lengths")
            elif isinstance(node, ast.Call) and _named(node.func) == "ScoreShape":
                offenders.append(f"{name}:{node.lineno} builds a ScoreShape by hand")
    assert not offenders, "token counts outside shared/work.py:\n" + "\n".join(offenders)


def test_bounds_and_the_manifest_are_typed_everywhere():
    """No dict bounds (`bounds["max_..."]`) and no manifest read by key outside shared/manifest.py."""
    offenders = []
    for name, tree in _code_files(skip="shared/manifest.py"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Constant):
                continue
            key, holder = node.slice.value, _named(node.value)
            if holder == "bounds" and isinstance(key, str):
                offenders.append(f"{name}:{node.lineno} reads bounds[{key!r}]")
            elif holder == "manifest" and key in MANIFEST_KEYS:
                offenders.append(f"{name}:{node.lineno} reads manifest[{key!r}]")
    assert not offenders, "untyped bounds or manifest:\n" + "\n".join(offenders)


def test_tools_read_worker_events_by_type_never_by_substring():
    """loadgen and bench decode shared/events.py's Structs; no string names an event's JSON key, and
    only shared/request_ids.py knows how a wire id is built."""
    offenders = []
    for name, tree in _code_files(skip="shared/events.py"):
        if not name.startswith(("loadgen/", "bench/")) and name != "shared/request_ids.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and '"event"' in node.value:
                offenders.append(f"{name}:{node.lineno} matches log text {node.value[:40]!r}")
            elif (isinstance(node, ast.Call) and _named(node.func) in ("split", "rsplit", "partition", "rpartition")
                  and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("~", "#")
                  and name != "shared/request_ids.py"):
                offenders.append(f"{name}:{node.lineno} takes a wire id apart by hand")
    assert not offenders, "log lines or wire ids parsed outside their declarations:\n" + "\n".join(offenders)


def _polls_readyz(node: ast.AST) -> bool:
    """A while loop that reads /readyz: a hand-written wait for a gateway to be ready."""
    return isinstance(node, ast.While) and any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "/readyz" in n.value for n in ast.walk(node))


def test_one_wait_ready():
    """Waiting for a started gateway to answer /readyz is loadgen/live.wait_ready's alone (stacks,
    benchmarks and tests call it): no other loop polls /readyz. Reading /readyz's worker states once
    per step (tests/chaos) is not a wait-ready and stays allowed."""
    files = _code_files(skip="loadgen/live.py")
    files += [(str(p.relative_to(ROOT)), ast.parse(p.read_text(), filename=str(p))) for p in _test_files()]
    offenders = [f"{name}:{node.lineno} polls /readyz in a loop of its own"
                 for name, tree in files for node in ast.walk(tree) if _polls_readyz(node)]
    assert not offenders, "use loadgen.live.wait_ready:\n" + "\n".join(offenders)


def test_the_vocabulary_checks_can_fail(tmp_path):
    """Each rule above finds what it forbids."""
    tree = ast.parse('x = prefix_len + sum(lens)\ny = ScoreShape(1, 2, 3, 4, 5)\nz = bounds["max_labels"]\n'
                     'w = self.manifest["nodes"]\n')
    nodes = list(ast.walk(tree))
    assert any(_adds_a_prefix_to_a_sum(n) for n in nodes)
    assert any(isinstance(n, ast.Call) and _named(n.func) == "ScoreShape" for n in nodes)
    assert {_named(n.value) for n in nodes if isinstance(n, ast.Subscript)} == {"bounds", "manifest"}
    loop = ast.parse('while time.monotonic() < end:\n    if get(f"{url}/readyz").status == 200:\n        break\n')
    assert _polls_readyz(loop.body[0])


# ---- One name per bound (CONTRIBUTING.md) ---------------------------------------------------------

RETIRED_NAMES = {"max_batch_tokens", "max_batch_items", "max_token_blocks", "token_blocks", "max_jobs"}
"""Names a bound once had besides its config name (max_tokens_per_batch, max_samples_per_batch, ...)."""


def _retired_in(tree: ast.AST) -> set[str]:
    """Retired names a file uses: as a name, attribute, argument, keyword, or a string (a Dim's name)."""
    found = set()
    for node in ast.walk(tree):
        for text in (getattr(node, "id", None), getattr(node, "attr", None), getattr(node, "arg", None),
                     node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None):
            if text in RETIRED_NAMES:
                found.add(text)
    return found


def test_every_bound_has_one_name():
    files = _code_files(skip="") + [(str(p.relative_to(ROOT)), ast.parse(p.read_text())) for p in _test_files()
                                     if p.name != "test_layering.py"]
    offenders = [f"{name}: {', '.join(sorted(found))}" for name, tree in files if (found := _retired_in(tree))]
    assert not offenders, "retired names of a bound:\n" + "\n".join(offenders)


def test_the_retired_name_check_can_fail():
    tree = ast.parse('b = BatchBounds(max_jobs=1)\nx.max_batch_tokens\nDim("token_blocks")\n')
    assert _retired_in(tree) == {"max_jobs", "max_batch_tokens", "token_blocks"}


def test_the_protocol_module_keeps_its_name():
    """`from shared import protocol`, never an alias: a reader greps one word for every use of the wire."""
    offenders = [f"{name}:{node.lineno}" for name, tree in _code_files(skip="") +
                 [(str(p.relative_to(ROOT)), ast.parse(p.read_text())) for p in _test_files()]
                 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "shared"
                 for alias in node.names if alias.name == "protocol" and alias.asname not in (None, "protocol")]
    assert not offenders, "the protocol module imported under another name:\n" + "\n".join(offenders)
