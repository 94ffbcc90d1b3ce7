"""bench/score_node.py and bench/shared_prefix.py --dtype int8 quantize the float precision a user of this CPU would
pick (--int8-base, bench/common.default_int8_base): bfloat16 where oneDNN multiplies it, float32 on AVX2 alone,
where bfloat16 runs aten's slow path; the run's float side, its files and its labels follow the base."""

from __future__ import annotations

import sys

import pytest
import torch

from bench import score_node, shared_prefix
from bench.common import dtype_label, run_dtype
from compile.linear import onednn_bf16, onednn_fp32


def parsed(monkeypatch, *argv: str, bench=score_node):
    monkeypatch.setattr(sys, "argv", [f"{bench.__name__}.py", *argv])
    return bench.parse_args()


def test_int8_quantizes_bfloat16_where_onednn_has_it_else_float32(monkeypatch):
    args = parsed(monkeypatch, "--dtype", "int8")
    base = "bf16" if onednn_bf16() else "fp32"
    assert args.int8_base == base
    assert score_node.run_dtype(args) == {"bf16": torch.bfloat16, "fp32": torch.float32}[base]
    names = {"bf16": "qwen2.5-0.5b-int8-24l", "fp32": "qwen2.5-0.5b-int8-fp32-24l"}
    assert score_node.run_name(args, 24) == names[base]


def test_a_float32_base_is_named_apart_from_the_bfloat16_one(monkeypatch):
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "fp32", "--int8-budget", "1")
    assert (score_node.run_dtype(args), score_node.run_name(args, 24)) == (torch.float32,
                                                                          "qwen2.5-0.5b-int8-fp32-24l-1nats")
    args = parsed(monkeypatch, "--dtype", "int8", "--int8-base", "bf16")
    assert (score_node.run_dtype(args), score_node.run_name(args, 24)) == (torch.bfloat16, "qwen2.5-0.5b-int8-24l")
    args = parsed(monkeypatch, "--dtype", "fp32", "--int8-budget", "1")  # a budget names only int8 runs
    assert (score_node.run_dtype(args), score_node.run_name(args, 24)) == (torch.float32, "qwen2.5-0.5b-fp32-24l")
    assert args.int8_base is None


@pytest.mark.parametrize("bench", [score_node, shared_prefix], ids=["score_node", "shared_prefix"])
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
