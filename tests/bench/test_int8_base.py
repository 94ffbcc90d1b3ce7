"""bench/score_node.py, bench/shared_prefix.py and bench/profile_nodes.py --dtype int8 quantize the float precision
a user of this CPU would pick (--int8-base, bench/harness/common.default_int8_base): bfloat16 where oneDNN multiplies it,
float32 on AVX2 alone, where bfloat16 runs aten's slow path; the run's float side, its files and its labels follow
the base."""

from __future__ import annotations

import sys

import pytest
import torch

from bench import beam_node, profile_nodes, score_node, shared_prefix
from bench.harness.common import dtype_label, int8_config, int8_report, run_dtype, run_name, run_quantize
from compile.linear import onednn_bf16, onednn_fp32
from shared.config import QuantizeConfig


def parsed(monkeypatch, *argv: str, bench=score_node):
    monkeypatch.setattr(sys, "argv", [f"{bench.__name__}.py", *argv])
    return bench.parse_args()


def test_int8_quantizes_bfloat16_where_onednn_has_it_else_float32(monkeypatch):
    args = parsed(monkeypatch, "--dtype", "int8")
    base = "bf16" if onednn_bf16() else "fp32"
    assert args.int8_base == base
    assert score_node.run_dtype(args) == {"bf16": torch.bfloat16, "fp32": torch.float32}[base]
    names = {"bf16": "qwen2.5-0.5b-int8-24l", "fp32": "qwen2.5-0.5b-int8-fp32-24l"}
    assert run_name(args, 24) == names[base]


def test_a_float32_base_is_named_apart_from_the_bfloat16_one(monkeypatch):
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32", "--int8-budget", "1")
    assert (score_node.run_dtype(args), run_name(args, 24)) == (torch.float32, "qwen2.5-0.5b-int8-fp32-24l-1nats")
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "bf16")
    assert (score_node.run_dtype(args), run_name(args, 24)) == (torch.bfloat16, "qwen2.5-0.5b-int8-24l")
    args = parsed(monkeypatch, "--dtype", "fp32", "--int8-budget", "1")  # a budget names only int8 runs
    assert (score_node.run_dtype(args), run_name(args, 24)) == (torch.float32, "qwen2.5-0.5b-fp32-24l")
    assert args.int8_base is None


@pytest.mark.parametrize("bench", [score_node, shared_prefix, profile_nodes],
                         ids=["score_node", "shared_prefix", "profile_nodes"])
def test_a_base_without_int8_is_refused(monkeypatch, capsys, bench):
    with pytest.raises(SystemExit):
        parsed(monkeypatch, "--dtype", "fp32", "--int8-base", "bf16", bench=bench)
    assert "--int8-base goes with --dtype int8" in capsys.readouterr().err


def test_the_shared_prefix_bench_quantizes_the_same_base_and_names_it(monkeypatch):
    args = parsed(monkeypatch, "--dtype", "int8", bench=shared_prefix)
    assert args.int8_base == ("bf16" if onednn_bf16() else "fp32")
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32", bench=shared_prefix)
    assert (run_dtype(args), dtype_label(args)) == (torch.float32, "int8-fp32")
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "bf16", bench=shared_prefix)
    assert (run_dtype(args), dtype_label(args)) == (torch.bfloat16, "int8")
    args = parsed(monkeypatch, "--dtype", "bf16", bench=shared_prefix)
    assert (run_dtype(args), dtype_label(args), args.int8_base) == (torch.bfloat16, "bf16", None)


def test_every_int8_bench_takes_the_same_budget_and_names_it(monkeypatch, capsys):
    """--int8-budget N: the same [quantize] (selection budget N, gate loosened to match) on every benchmark, named
    in its build folder and result file; without int8 it is refused where nothing else could use it (beam_node)."""
    assert int8_config(None) == QuantizeConfig(int8=True)  # the product's defaults
    assert run_quantize(parsed(monkeypatch, "--dtype", "fp32", "--int8-budget", "1")) is None  # float runs: none
    assert run_quantize(parsed(monkeypatch, "--dtype", "int8", "--int8-budget", "1")) == int8_config(1)
    one = int8_config(1)
    assert (one.selection_max_drift, one.max_label_logprob_drift, one.mean_label_logprob_drift) == (1, 2, 1)
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32", "--int8-budget", "1", bench=shared_prefix)
    assert run_name(args, 24) == "qwen2.5-0.5b-int8-fp32-24l-1nats"
    args = parsed(monkeypatch, "--int8", "--int8-base", "bf16", "--int8-budget", "1", bench=beam_node)
    assert (args.int8_budget, beam_node.int8_name(args)) == (1, "-int8-1nats")
    assert beam_node.int8_name(parsed(monkeypatch, "--int8", "--int8-base", "bf16", bench=beam_node)) == "-int8"
    assert beam_node.int8_name(parsed(monkeypatch, bench=beam_node)) == ""
    for option in ("--int8-budget", "--int8-base"):
        with pytest.raises(SystemExit):
            parsed(monkeypatch, option, "1" if option == "--int8-budget" else "fp32", bench=beam_node)
        assert f"{option} goes with --int8" in capsys.readouterr().err


def test_the_beam_bench_quantizes_the_same_base_as_the_score_bench_and_names_it(monkeypatch):
    args = parsed(monkeypatch, "--int8", bench=beam_node)
    assert args.int8_base == parsed(monkeypatch, "--dtype", "int8").int8_base
    args = parsed(monkeypatch, "--int8", "--int8-base", "fp32", "--int8-budget", "0.5", bench=beam_node)
    assert (args.int8_base, beam_node.int8_name(args)) == ("fp32", "-int8-fp32-0.5nats")
    assert parsed(monkeypatch, bench=beam_node).int8_base is None


def test_the_profile_quantizes_the_same_base_as_the_score_bench(monkeypatch):
    """profile_nodes --dtype int8 profiles the node score_node times: same base, same build name."""
    for argv in (("--dtype", "int8"), ("--dtype", "int8", "--int8-base", "fp32", "--int8-budget", "1"),
                 ("--dtype", "int8", "--int8-base", "bf16")):
        profiled, timed = parsed(monkeypatch, *argv, bench=profile_nodes), parsed(monkeypatch, *argv)
        assert profiled.int8_base == timed.int8_base
        assert (run_dtype(profiled), run_name(profiled, 24)) == (run_dtype(timed), run_name(timed, 24))
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32", bench=profile_nodes)
    assert (run_dtype(args), run_name(args, 24)) == (torch.float32, "qwen2.5-0.5b-int8-fp32-24l")


def test_the_float_side_is_timed_and_labelled_under_its_base(monkeypatch):
    calls = []
    contenders = score_node.Contenders(lambda *a: calls.append("int8"), None, None, 15, None,
                                       float_node=lambda *a: calls.append("fp32"), float_name="fp32")
    fns = contenders.for_request([torch.tensor([1, 2, 3])])
    assert {"ours", "ours_fp32"} <= set(fns) and "ours_bf16" not in fns
    fns["ours_fp32"]()
    assert calls == ["fp32"]
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32")
    labels = score_node.gemm_labels(args, {"ours": 1.0, "ours_fp32": 1.0, "hf_best": 1.0})
    assert labels["ours"].startswith("oneDNN int8")
    kernel = "oneDNN matmul, weights prepacked at load" if onednn_fp32("score") else "MKL's sgemm"
    assert labels["ours_fp32"].startswith(kernel) and "(model.gemm = auto" in labels["ours_fp32"]
    assert labels["ours"].endswith(f"the rest: {labels['ours_fp32']}")
    assert labels["hf_best"] == "torch default (MKL sgemm)"


def test_an_int8_run_reports_its_build_as_score_node_and_shared_prefix_write_it():
    quantized = {"int8_layers": ["a", "b"], "float_layers": ["c"], "gate": {"max_label_logprob_drift": 0.5},
                 "limits": {"max_label_logprob_drift": 2.0}}
    assert int8_report(quantized) == {"int8_layers": "2 of 3", "int8_gate": {"max_label_logprob_drift": 0.5},
                                      "int8_limits": {"max_label_logprob_drift": 2.0}}
    assert int8_report(None) == {"int8_layers": None, "int8_gate": None, "int8_limits": None}
