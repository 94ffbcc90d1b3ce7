"""bench/profile_nodes.py: oneDNN's int8 GEMMs are counted as a family of their own, and the kernel timed alone per
shape is the one our int8 layers call (same result as the layer, up to its row rescaling); of the profiled calls the
one with the fewest page faults counts."""

from __future__ import annotations

import torch

from bench.harness.common import gemm_libraries, matmul_peaks
from bench import profile_nodes
from bench.profile_nodes import family_kernels, family_of, gemm_table, int8_kernel, random_int8_kernel
from compile.linear import onednn_bf16
from compile.quantize.int8 import Int8Linear


def test_int8_gemms_are_their_own_family_and_float_ones_stay_gemm():
    assert family_of("onednn::qlinear_pointwise") == "gemm_int8"
    assert family_of("mkldnn::_linear_pointwise") == "gemm"
    assert family_of("cpp_fused_mul_silu_0") == "other"


def test_each_family_names_the_kernels_that_ran_it_most_time_first():
    """Which attention ran is in the profile: worker/runtime/kernels' AMX operator counts as attention and is named."""
    events = [("boundserve::packed_attention_amx", 5.0), ("mkldnn::_linear_pointwise", 7.0),
              ("cpp_fused_mul_silu_0", 1.0), ("cpp_fused_add_rms_1", 2.0), ("mkldnn::_linear_pointwise", 1.5)]
    totals, kernels = family_kernels(events)
    assert totals == {"attention": 5.0, "gemm": 8.5, "other": 3.0}
    assert kernels["attention"] == [{"kernel": "boundserve::packed_attention_amx", "ms": 5.0}]
    assert kernels["gemm"] == [{"kernel": "mkldnn::_linear_pointwise", "ms": 8.5}]
    assert [k["kernel"] for k in kernels["other"]] == ["cpp_fused_add_rms_1", "cpp_fused_mul_silu_0"]
    many = [(f"cpp_fused_{i}", float(i)) for i in range(10)]
    assert [k["ms"] for k in family_kernels(many)[1]["other"]] == [9.0, 8.0, 7.0, 6.0][:profile_nodes.KERNELS_PER_FAMILY]


def test_the_int8_kernel_alone_is_the_int8_layers_kernel():
    """Rows of one absmax need no rescaling after the kernel: the layer's output is the kernel's, bit for bit."""
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(64, 32, bias=False))
    x = torch.randn(8, 64)
    x = (x / x.abs().amax(-1, keepdim=True)).to(torch.bfloat16)  # every row's absmax is 1
    assert torch.equal(int8_kernel(layer, x)(), layer(x))
    assert random_int8_kernel(8, 64, 32)().shape == (8, 32)
    assert random_int8_kernel(8, 64, 32, torch.float32)().dtype == torch.float32  # an int8 node on a float32 base


def test_the_gemm_table_times_the_int8_kernel_against_its_own_peak():
    rows, totals, peaks = gemm_table({(16, 64, 32): 2}, torch.float32, peak=1e15, int8_peak=2e15)
    assert set(totals) == {"torch.mm", "onednn", "onednn_prepacked", "onednn_int8_prepacked"}
    assert peaks == {"float": 1e15, "int8": 2e15}  # no tiny shape runs at a PFLOP/s on a CPU
    row = rows[0]
    assert row["calls"] == 2 and row["onednn_int8_prepacked_ms"] > 0
    assert row["onednn_int8_prepacked_of_peak"] == 2 * 16 * 64 * 32 / (row["onednn_int8_prepacked_ms"] / 1e3) / 2e15
    assert row["onednn_of_peak"] == 2 * 16 * 64 * 32 / (row["onednn_ms"] / 1e3) / 1e15
    assert totals["onednn_int8_prepacked"] == row["onednn_int8_prepacked_ms"] * 2
    assert "onednn_int8_prepacked" not in gemm_table({(16, 64, 32): 1}, torch.float32, peak=1e15)[1]


def test_a_shape_faster_than_the_measured_peak_becomes_the_peak():
    """A peak measured on large shapes is passed by small ones whose weights stay in cache; the table's fractions
    are of the best rate the run saw, per precision, so none passes 1 and the fastest is exactly 1."""
    rows, _, peaks = gemm_table({(16, 64, 32): 1, (32, 64, 64): 1}, torch.float32, peak=1.0, int8_peak=1.0)
    float_fractions = [row[f"{lib}_of_peak"] for row in rows for lib in gemm_libraries(torch.float32)]
    int8_fractions = [row["onednn_int8_prepacked_of_peak"] for row in rows]
    assert peaks["float"] > 1.0 and peaks["int8"] > 1.0
    assert max(float_fractions) == 1.0 and max(int8_fractions) == 1.0
    assert min(float_fractions + int8_fractions) > 0


def test_bfloat16_tables_time_only_the_libraries_this_cpu_has():
    """On AVX2 alone oneDNN refuses bfloat16 (the build takes aten there): the table and the peak leave it out
    instead of failing; where it runs, they time it, prepacked as the node's linears are."""
    expected = {"torch.mm", "onednn", "onednn_prepacked"} if onednn_bf16() else {"torch.mm"}
    assert set(gemm_libraries(torch.bfloat16)) == expected
    rows, totals, _ = gemm_table({(16, 64, 32): 1}, torch.bfloat16, peak=1e12)
    assert set(totals) == expected and all(rows[0][f"{lib}_ms"] > 0 for lib in expected)
    assert set(matmul_peaks(torch.bfloat16, ((16, 64, 32),), bursts=1, seconds=0.01)) == expected


def test_the_peak_includes_the_prepacked_kernel_the_nodes_call():
    """Our linears call oneDNN on prepacked weights; a peak without that kernel can be passed by the node itself."""
    peaks = matmul_peaks(torch.float32, ((64, 64, 64),), bursts=1, seconds=0.01)
    assert set(peaks) == {"torch.mm", "onednn", "onednn_prepacked"} and min(peaks.values()) > 0


def test_the_profiled_call_with_the_fewest_faults_counts(monkeypatch):
    """The first profiled call touches 64 MiB of fresh pages and multiplies, the later ones only add: the profile
    returned is a later one's (no gemm family), with its own few faults."""
    monkeypatch.setattr(profile_nodes, "grow_heap_top", lambda: None)  # its 2 GiB are not this test's subject
    a, kept, calls = torch.randn(64, 64), [], []

    def call():
        calls.append(len(calls))
        if len(calls) == 2:  # the first call is the warm-up
            kept.append(torch.ones(64 << 20, dtype=torch.uint8))
            return torch.mm(a, a)
        return a + a

    families, faults, kernels = profile_nodes.compiled_profile(call)
    assert len(calls) == 1 + profile_nodes.PROFILED_CALLS
    assert "gemm" not in families and families["other"] > 0
    assert "aten::add" in [k["kernel"] for k in kernels["other"]] and "gemm" not in kernels
    assert 0 <= faults < (64 << 20) // 4096 // 2


def test_the_linear_layers_flops_are_the_nodes_gemm_flops_less_the_float_only_ones():
    """An int8 run splits the GEMM FLOPs between the int8 and the float family by layer name: the named layers'
    FLOPs and the ones that always stay float (the last layer's k/v on T rows and q on B, the head) add up to the
    node's GEMM FLOPs (bench/harness/flops.py's terms), and every name is one compile/fp8.candidate_linears gives."""
    from bench.harness.flops import _head, _kv, _q_o_mlp
    from compile.checkpoint import ModelSpec, RopeSpec
    from compile.fp8 import candidate_linears
    from compile.model import Transformer

    spec = ModelSpec(family="qwen2", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                     num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope=RopeSpec(theta=1e4), qkv_bias=True,
                     o_bias=False, qk_norm=False, tie_word_embeddings=True, dtype="float32",
                     max_position_embeddings=128)
    lengths = [5, 9, 30]
    t, b = sum(lengths), len(lengths)
    per_layer = profile_nodes.linear_flops(spec, lengths)
    q_rows = 2 * b * spec.hidden_size * spec.num_heads * spec.head_dim
    node = (spec.num_layers - 1) * (_q_o_mlp(spec) + _kv(spec)) * t + _kv(spec) * t + _q_o_mlp(spec) * b + _head(spec, b)
    assert sum(per_layer.values()) + _kv(spec) * t + q_rows + _head(spec, b) == node
    assert set(per_layer) == set(candidate_linears(Transformer(spec)))


def test_the_machine_class_is_the_given_one_or_the_cpus():
    assert profile_nodes.machine_class("avx512-halfrate") == ("avx512-halfrate", "--machine-class")
    found, source = profile_nodes.machine_class(None)
    assert source == "CPU features"
    assert found == ("amx" if torch.cpu._is_amx_tile_supported() else torch.backends.cpu.get_cpu_capability().lower())


def test_the_peak_is_measured_on_every_linear_of_a_layer():
    """Qwen2.5-0.5B's layer: q/k/v (14 + 2 x 2 heads of 64), output, MLP gate-up and down, at the given rows."""
    from types import SimpleNamespace

    from bench.harness.common import model_gemm_shapes

    layer = SimpleNamespace(hidden_size=896, intermediate_size=4864, num_heads=14, num_kv_heads=2, head_dim=64)
    assert model_gemm_shapes(layer, 4285) == ((4285, 896, 1152), (4285, 896, 896), (4285, 896, 9728),
                                             (4285, 4864, 896))
