"""bench/report.py: the README's and docs/benchmarks.md's tables are what the committed result files render,
a hand-edited figure or an edited result is named by --check, and bench/results holds one current file per
benchmark and machine class."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from bench import report
from bench.report import DOCUMENTS, ReportError, differences, main, render_text, rewrite
from bench.harness.report_tables import HEADLINE_CLASS, seconds
from bench.harness.result_files import ResultFile, read_results

ROOT = report.ROOT
RESULTS = ROOT / "bench" / "results"
HEADLINE_FILE = f"score_node-qwen2.5-0.5b-fp32-24l-{HEADLINE_CLASS}"
"""A result the README's headline table shows (any of its rows would do)."""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the documents and result files, to edit without touching the repository."""
    for document in DOCUMENTS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / document, tmp_path / document)
    shutil.copytree(RESULTS, tmp_path / "bench" / "results")
    return tmp_path


def test_the_committed_tables_are_what_the_result_files_render():
    assert differences(ROOT) == [], "run `python bench/report.py` and commit the tables it rewrites"


def test_every_document_shows_its_tables():
    """Each document has marked tables, the README the headline, and each marked table renders rows."""
    readme = (ROOT / "README.md").read_text()
    assert "<!-- report:begin headline -->" in readme
    results = read_results(RESULTS)
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        names = re.findall(r"<!-- report:begin ([\w-]+) -->", text)
        assert names, f"{document} has no rendered table"
        for name in names:
            assert report.rendered(name, results).count("\n| ") >= 2, f"{document}: table {name} has no rows"


def test_a_hand_edited_figure_is_named_by_check_and_rendered_back(checkout, capsys):
    figure = seconds(json.loads((RESULTS / f"{HEADLINE_FILE}.json").read_text())["ms_per_request"]["ours"])
    readme = checkout / "README.md"
    text = readme.read_text()
    row = next(line for line in text.splitlines() if f"`{HEADLINE_FILE}`" in line)
    assert f"| {figure} |" in row, "the headline row shows the file's own figure"
    readme.write_text(text.replace(row, row.replace(f"| {figure} |", "| 1.00 s |")))

    assert differences(checkout) == ["README.md: headline"]
    assert main(["--check", "--root", str(checkout)]) == 1
    assert "README.md: headline" in capsys.readouterr().err

    assert rewrite(checkout) == ["README.md: headline"]
    assert readme.read_text() == text
    assert main(["--check", "--root", str(checkout)]) == 0


def test_an_edited_result_names_every_table_that_shows_it(checkout):
    path = checkout / "bench" / "results" / f"{HEADLINE_FILE}.json"
    result = json.loads(path.read_text())
    result["ms_per_request"]["ours"] *= 2
    path.write_text(json.dumps(result))
    assert sorted(differences(checkout)) == ["README.md: headline", "docs/benchmarks.md: score"]


def test_each_row_names_its_files_commit_machine_class_and_load():
    results = read_results(RESULTS)
    readme = (ROOT / "README.md").read_text()
    headline = readme.split("<!-- report:begin headline -->")[1].split("<!-- report:end headline -->")[0]
    shown = set(re.findall(r"`([\w.-]+)` · ", readme))
    assert re.findall(r"`([\w.-]+)` · ", headline), "the headline names no result file"
    for name in shown:
        result = results[name]
        machine, how = result.machine_class
        load = "load not sampled" if result.load_median is None else f"load {result.load_median:g}"
        assert f"`{name}` · {result.commit} · {machine} ({how}) · {load}" in readme
        assert result.commit == result.run["commit"][:7]
        if f"`{name}` · " in headline:  # the headline's runs: one machine class
            assert machine == HEADLINE_CLASS


def test_a_marker_naming_no_table_is_refused():
    with pytest.raises(ReportError, match="no-such-table"):
        render_text("<!-- report:begin no-such-table -->\n<!-- report:end no-such-table -->\n", {})


def test_the_machine_class_is_recorded_else_from_the_name_else_from_the_features():
    def result(name: str, run: dict) -> ResultFile:
        return ResultFile(name, {"run": run})

    amx = {"isa": "AVX512", "amx": True}
    assert result("x-avx2", {"machine_class": "gpu-h100", "cpu_features": amx}).machine_class == (
        "gpu-h100", "recorded")
    assert result("x-avx512-halfrate", {"cpu_features": amx}).machine_class == ("avx512-halfrate", "file name")
    assert result("x", {"cpu_features": amx}).machine_class == ("amx", "CPU features")
    assert result("x", {"cpu_features": {"isa": "AVX2", "amx": False}}).machine_class == ("avx2", "CPU features")
    assert result("x", {}).machine_class == ("unrecorded", "nothing recorded")
    assert result("score_node-m-fp32-28l-3rounds-avx512-halfrate", {}).key == "score_node-m-fp32-28l"


def test_one_current_file_per_benchmark_and_machine_class():
    results = read_results(RESULTS)
    counts = Counter((r.key, r.machine_class[0]) for r in results.values())
    assert not [kind for kind, n in counts.items() if n > 1], "delete the superseded file (git keeps it)"


def test_the_index_lists_every_result_file():
    index = (ROOT / "docs" / "benchmarks.md").read_text().split("<!-- report:begin index -->")[1]
    for path in RESULTS.glob("*.json"):
        assert f"`{path.stem}`" in index


TYPED_FIGURE = re.compile(r"\d+\.\d+\s?×|\d+\.\d+ (?:s|ms|µs|GFLOP/s|GiB|req/s)\b")
"""A measured ratio or time written by hand: what only a rendered table may show."""


def test_no_figure_is_typed_outside_the_rendered_tables():
    for document in ["README.md", *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]:
        text = (ROOT / document).read_text()
        prose = re.sub(r"<!-- report:begin ([\w-]+) -->.*?<!-- report:end \1 -->", "", text, flags=re.S)
        prose = re.sub(r"```.*?```", "", prose, flags=re.S)
        assert not TYPED_FIGURE.findall(prose), f"{document} types figures: {TYPED_FIGURE.findall(prose)}"


def test_every_result_file_a_document_cites_is_committed():
    """A sentence saying where a script writes names a destination, not a result; every other is committed."""
    cited = re.compile(r"bench/results/([\w.*-]+\.json)")
    for document in ["README.md", *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]:
        for sentence in re.split(r"(?<=\.)\s", (ROOT / document).read_text()):
            for name in () if "write" in sentence else cited.findall(sentence):
                assert list(RESULTS.glob(name)), f"{document} cites bench/results/{name}, which is not committed"


def test_the_overload_goals_say_no_where_a_figure_misses_its_goal(checkout):
    path = checkout / "bench" / "results" / "overload-trace.json"
    result = json.loads(path.read_text())
    result["admission_over_bound"]["2x"] = 0.5
    path.write_text(json.dumps(result))
    assert "README.md: overload-goals" in differences(checkout)
    rows, _ = render_text("<!-- report:begin overload-goals -->\n<!-- report:end overload-goals -->\n",
                       read_results(checkout / "bench" / "results"))
    bound_row = next(line for line in rows.splitlines() if "over the clairvoyant bound" in line)
    assert "trace 2x: 0.500" in bound_row and "| **no** |" in bound_row
