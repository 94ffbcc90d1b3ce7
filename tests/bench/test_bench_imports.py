"""Every benchmark and harness module imports: a benchmark nobody ran for a while must not have rotted
(two once imported a name their neighbour no longer had, and failed only when someone ran them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("ctranslate2", "openvino")  # the bench extra's engines, which `make test` does not install
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "bench").rglob("*.py"))
# One process imports them all (torch once), and says which failed and why.
PROBE = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in json.loads(sys.argv[2]):
            continue  # a peer engine of the bench extra, absent here
        failed[name] = traceback.format_exc(limit=3)
    except Exception:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


def test_every_bench_module_imports():
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(MODULES), json.dumps(PEERS)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


def test_the_probe_reports_a_module_that_does_not_import(tmp_path):
    (tmp_path / "rotted.py").write_text("from json import no_such_name\n")
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["rotted"]), json.dumps(PEERS)], cwd=tmp_path,
                            capture_output=True, text=True)
    assert "no_such_name" in json.loads(result.stdout.strip().splitlines()[-1])["rotted"]
