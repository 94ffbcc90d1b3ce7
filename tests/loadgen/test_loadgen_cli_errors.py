"""Bad input to `python -m loadgen`: exit status 2 and one line naming the option, file or line and the
problem, before any work is done; nothing asked for is rewritten or ignored."""

import json

import pytest

from loadgen.__main__ import main
from loadgen.importers import ImportOptions, import_trace
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import TraceError, read_trace, write_trace

OFFLINE = ["--offline", "--latency-model", "0,0.01,0.2,2"]
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n1,30,3\n2,40,5\n3,50,2\n"


@pytest.fixture
def files(tmp_path):
    """{name: path}: a trace, an Azure CSV, a plain file and a folder, for the command lines below."""
    trace = tmp_path / "t.jsonl"
    write_trace(synthesize(SynthSpec(duration_s=1, score_fraction=0.5)), trace)
    (tmp_path / "az.csv").write_text(AZURE)
    (tmp_path / "afile").write_text("not a folder\n")
    return {"trace": str(trace), "csv": str(tmp_path / "az.csv"), "file": str(tmp_path / "afile"),
            "dir": str(tmp_path), "out": str(tmp_path / "out.jsonl")}


def refused(argv: list[str], capsys) -> str:
    """Run the CLI, assert it exits with status 2 and no traceback, and return its one error line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(lines) == 1, captured.err
    return lines[0]


USAGE = [
    (["replay", "--trace", "{trace}", "--bin-s", "0"], "argument --bin-s: must be a number > 0, got '0'"),
    (["synth", "--out", "{out}", "--samples", "0"], "argument --samples: must be an integer >= 1"),
    (["synth", "--out", "{out}", "--tokens-per-sample", "-3"], "argument --tokens-per-sample: must be an integer >= 1"),
    (["synth", "--out", "{out}", "--beam-width", "0"], "argument --beam-width: must be an integer >= 1"),
    (["synth", "--out", "{out}", "--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1"),
    (["synth", "--out", "{out}", "--deadline-ms", "-5"], "argument --deadline-ms: must be a number of milliseconds"),
    (["synth", "--out", "{out}", "--deadline-ms", "0.4"], "argument --deadline-ms: must be a number of milliseconds"),
    (["import", "{csv}", "--format", "azure", "--out", "{out}", "--limit", "-1"], "argument --limit: must be an "
                                                                                   "integer >= 1, got '-1'"),
    (["import", "{csv}", "--format", "azure", "--out", "{out}", "--limit", "0"], "argument --limit: must be an "
                                                                                  "integer >= 1, got '0'"),
    (["import", "{csv}", "--format", "azure", "--out", "{out}", "--route", "generate", "--beam-width", "0"],
     "argument --beam-width: must be an integer >= 1"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10", "--workers", "0", *OFFLINE],
     "argument --workers: must be an integer >= 1, got '0'"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10", "--workers", "-2", *OFFLINE],
     "argument --workers: must be an integer >= 1, got '-2'"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates=-10,0", *OFFLINE],
     "argument --rates: must be comma-separated numbers > 0; '-10' in '-10,0' is not one"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10,abc", *OFFLINE],
     "argument --rates: must be comma-separated numbers > 0; 'abc' in '10,abc' is not one"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates=,", *OFFLINE],
     "argument --rates: must be comma-separated numbers > 0, got ','"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10", "--pct", "150", *OFFLINE],
     "argument --pct: must be a percentage above 0 and at most 100, got '150'"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "-100", "--rates", "10", *OFFLINE],
     "argument --slo-ms: must be a number > 0, got '-100'"),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10", "--refine", "-3", *OFFLINE],
     "argument --refine: must be an integer >= 0, got '-3'"),
    (["validate", "--trace", "{trace}", "--config", "c.toml", "--artifacts", "a", "--levels", "a,b"],
     "argument --levels: must be comma-separated numbers > 0; 'a' in 'a,b' is not one"),
    (["replay", "--trace", "{trace}", "--label-token-ids", "a,b"],
     "argument --label-token-ids: must be comma-separated token ids (integers >= 0); 'a' in 'a,b' is not one"),
]


@pytest.mark.parametrize("argv, message", USAGE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in USAGE])
def test_bad_numbers_are_usage_errors_naming_the_option(argv, message, files, capsys):
    assert message in refused([a.format(**files) for a in argv], capsys)


RETRY = [
    (["--retry"], "--retry needs --replica URL"),
    (["--retry-try-share", "0.5"], "--retry-try-share is a setting of --retry"),
    (["--retry", "--replica", "http://127.0.0.1:1", "--retry-try-share", "1"], "--retry-try-share must be below 1"),
]


@pytest.mark.parametrize("extra, message", RETRY, ids=[" ".join(e) for e, _ in RETRY])
def test_retry_options_that_cannot_keep_to_a_deadline_are_refused_before_any_send(extra, message, files, capsys):
    assert message in refused(["replay", "--trace", files["trace"], "--url", "http://127.0.0.1:1", *extra], capsys)


GRID = [
    ("max_samples_per_batch=0,1", "--grid max_samples_per_batch=0: bounds.max_samples_per_batch = 0 must be an "
                                  "integer of at least 2"),
    ("max_batch_wait_ms=-5", "--grid max_batch_wait_ms=-5: gateway.max_batch_wait_ms = -5 must be a number of at "
                             "least 0"),
    ("max_batch_wait_ms=1,x", "--grid max_batch_wait_ms=x: gateway.max_batch_wait_ms = \"x\" must be a number"),
    ("score_deadline_ms=40.5", "--grid score_deadline_ms=40.5: gateway.score_deadline_ms = 40.5 must be an integer"),
    ("workers=0", "--grid workers=0: workers = 0 must be an integer of at least 1"),
    ("max_tokens_per_sample=8192", "bounds.max_tokens_per_sample must not exceed bounds.max_tokens_per_batch"),
    ("max_batch_wait_ms=", "--grid 'max_batch_wait_ms=': expected NAME=v1,v2,..."),
    ("compute_jitter=1", "--grid 'compute_jitter' is not a setting"),
]


@pytest.mark.parametrize("item, message", GRID, ids=[item for item, _ in GRID])
def test_grid_values_are_checked_by_the_configs_rules_before_tuning(item, message, files, capsys):
    line = refused(["tune", "--trace", files["trace"], "--slo-ms", "50", *OFFLINE, "--grid", item], capsys)
    assert line.startswith("loadgen tune: error: ") and message in line


def test_grid_values_take_the_types_of_their_settings(files, capsys):
    assert main(["tune", "--trace", files["trace"], "--slo-ms", "50", *OFFLINE, "--grid", "admission=true,false",
                 "--grid", "queue_order=arrival", "--grid", "workers=1,2", "--out", files["out"]]) == 0
    rows = json.loads(open(files["out"]).read())["candidates"]
    assert [(row["admission"], row["queue_order"], row["workers"]) for row in rows] == [
        (True, "arrival", 1), (True, "arrival", 2), (False, "arrival", 1), (False, "arrival", 2)]


FILES = [
    (["synth", "--out", "{dir}"], "argument --out: {dir} is a folder; expected a file to write"),
    (["synth", "--out", "{dir}/missing/t.jsonl"], "argument --out: cannot write {dir}/missing/t.jsonl: folder "
                                                  "{dir}/missing does not exist"),
    (["tune", "--trace", "{trace}", "--slo-ms", "50", *OFFLINE, "--write-config", "{dir}"],
     "argument --write-config: {dir} is a folder"),
    (["sweep", "--trace", "{dir}", "--slo-ms", "50", "--rates", "10", *OFFLINE], "loadgen sweep: error: {dir}: "),
    (["import", "{dir}", "--format", "azure", "--out", "{out}"], "loadgen import: error: {dir}: "),
    (["sweep", "--trace", "{trace}", "--slo-ms", "50", "--rates", "10", *OFFLINE, "--out-dir", "{file}"],
     "argument --out-dir: cannot write into {file}: {file} is a file, not a folder"),
    (["replay", "--trace", "{trace}", "--out-dir", "{file}/sub"],
     "argument --out-dir: cannot write into {file}/sub: {file} is a file, not a folder"),
]


@pytest.mark.parametrize("argv, message", FILES, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in FILES])
def test_file_errors_are_one_line_naming_the_path(argv, message, files, capsys):
    assert message.format(**files) in refused([a.format(**files) for a in argv], capsys)


def test_a_trace_deadline_under_the_gateways_shortest_is_refused_naming_the_line(files):
    path = files["dir"] + "/early.jsonl"
    with open(path, "w") as out:
        out.write('{"t_ms": 0, "route": "score", "sample_tokens": [4], "deadline_ms": 0.4}\n')
    with pytest.raises(TraceError, match=r"early\.jsonl:1: deadline_ms must be at least 1"):
        read_trace(path)


def test_a_trace_meta_line_must_be_an_object(files):
    path = files["dir"] + "/meta.jsonl"
    with open(path, "w") as out:
        out.write('{"meta": 5}\n' + open(files["trace"]).read())
    with pytest.raises(TraceError, match=r"meta\.jsonl:1: meta must be a JSON object, got int"):
        read_trace(path)


@pytest.mark.parametrize("field, value, message", [
    ("samples", 0, "samples = 0 must be between 1 and max_samples"),
    ("samples", 100, "samples = 100 must be between 1 and max_samples \\(64;"),
    ("tokens_per_sample", -3, "tokens_per_sample = -3 must be between 1"),
    ("beam_width", 0, "beam_width must be >= 1"),
    ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
    ("deadline_ms", -5.0, "deadline_ms must be at least 1"),
    ("deadline_ms", 0.0, "deadline_ms must be at least 1"),
])
def test_synth_refuses_what_it_would_rewrite_or_loadgen_could_not_read(field, value, message):
    with pytest.raises(ValueError, match=message):
        synthesize(SynthSpec(duration_s=1, score_fraction=0.5, **{field: value}))


def test_import_limit_and_beam_width_are_kept_as_given(files):
    assert len(import_trace(files["csv"], "azure", ImportOptions(limit=1)).records) == 1
    for options in (ImportOptions(limit=0), ImportOptions(route="generate", beam_width=0)):
        with pytest.raises(ValueError, match="must be >= 1, got 0"):
            import_trace(files["csv"], "azure", options)


def test_synth_caps_are_options_and_their_refusal_names_them(files, capsys):
    line = refused(["synth", "--out", files["out"], "--samples", "100"], capsys)
    assert "samples = 100 must be between 1 and max_samples (64; --max-samples)" in line
    assert main(["synth", "--out", files["out"], "--samples", "100", "--max-samples", "128", "--duration-s", "1"]) == 0
    records = read_trace(files["out"]).records
    assert max(len(r.sample_tokens) for r in records if r.route == "score") > 64


def test_the_default_tune_grid_stays_within_the_configs_longest_deadline(files, capsys):
    """With no --grid, deadlines around a long SLO are capped at max_deadline_ms, not refused as a bad grid."""
    out = files["dir"] + "/tune.json"
    assert main(["tune", "--trace", files["trace"], "--slo-ms", "100000", *OFFLINE, "--out", out]) == 0
    report = json.loads(open(out).read())
    assert max(c["score_deadline_ms"] for c in report["candidates"]) == 60_000


def test_capacity_that_no_worker_count_reaches_is_said_in_words(files, capsys):
    """--capacity with an SLO no count up to --max-workers meets: 'more than N', never 'None workers'."""
    argv = ["tune", "--trace", files["trace"], "--slo-ms", "1", *OFFLINE, "--capacity", "--max-workers", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "None workers" not in out and "more than 2 workers (--max-workers)" in out, out
