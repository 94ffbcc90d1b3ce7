"""Prefill-only scoring: our compiled node against transformers (careful, and at its best), CTranslate2 and OpenVINO.

Model: Qwen2.5-0.5B's or Qwen3-0.6B's shapes at their real depth (or --layers N), random weights
written by transformers. Requests: 15 samples each, lengths uniform in 32..480 (fixed seed).
Contenders, timed interleaved request by request in one process, same threads (--rounds R: R rounds per
request, the order rotated each round, each request counted at its median round; on a machine whose speed
drifts, every round is kept in ms_by_round, and the minor page faults of every call in minor_faults_by_round;
before them one untimed round on the first request, whose faults are warm_up_minor_faults: time_requests):
  ours        one packed call per request (no padding computed; the last layer only at the last tokens);
  hf_careful  the request as one left-padded batch, last position projected (bench/harness/hf_baselines.py);
  hf_best     length-sorted micro-batches, at the micro-batch size that was fastest in a sweep; its
              float32 linears on torch's default GEMM (MKL's sgemm, an AVX2 path on AMD CPUs);
  hf_best_onednn  (float32 runs) the same with transformers' linears on oneDNN's matmul, the kernel
              our float32 node uses on AVX-512 (bench/harness/hf_baselines.linears_on; on AVX2 alone ours runs MKL's,
              as hf_best does), at its own fastest micro-batch: its ratio is what the engine adds beyond
              the GEMM library;
  ct2         CTranslate2 at the max_batch_size (and, for bf16 and int8 runs, the CPU compute type: every one
              it offers, bench/harness/ct2_baseline.sweep_types) that was fastest in a sweep, among those
              within the quantized bound; float32 when we run float32;
  openvino    OpenVINO (bench/harness/openvino_baseline.py: Intel's CPU runtime, the strongest CPU contender)
              at the run's precision (an int8 run: its own int8, NNCF's weight compression, at the base's
              precision hint), last position projected, at the micro-batch size that was fastest in a sweep
              (openvino_setting says which).
  ours_bf16   (--dtype int8) our node without int8 layers: --dtype int8 builds the model in --int8-base
  ours_fp32   (bf16 where oneDNN multiplies bfloat16 on this CPU, else fp32: on AVX2 alone bfloat16 runs
              aten's slow path and a user picks float32) with `[quantize] int8` (calibrated on random token ids,
              the default gate) and reports speedup_vs_bf16 or speedup_vs_fp32, the label log-prob drift of
              ours and of CTranslate2's int8 against transformers in float32 on the same inputs
              (max_label_logprob_drift, ct2_max_label_logprob_drift); transformers runs the base.
Their outputs are checked against each other (bench/harness/parity.py) and the run exits non-zero when one
disagrees beyond its tolerance. executed_mfu = FLOPs our node executes (bench/harness/flops.py) / time /
the best large-matmul rate of the dtype (torch.mm or oneDNN) measured in the same run, before and
after the timed part.

Parity is asserted before anything is written: a run that fails it writes no result and exits
non-zero (bench/harness/provenance.py). OpenVINO's bfloat16 is reported instead (`openvino_accuracy`, with
`within_bound`): its label logits may miss the bf16 bound (1.5x transformers' own bf16 error + 0.02;
Qwen3-0.6B on an AVX-512 CPU without AMX: 0.547 against 0.508), and the run still compares against it,
the faster side, rather than write nothing.

    .venv/bin/python bench/score_node.py [--model qwen2.5-0.5b|qwen3-0.6b] [--dtype fp32|bf16|int8] [--layers N]
                                         [--requests R] [--rounds R] [--quick] [--no-ct2] [--no-openvino]
                                         [--int8-budget N] [--int8-base bf16|fp32] [--build-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness import parity
from bench.harness.common import (CACHE, FLOAT_DTYPES, MODELS, SCORE_BOUNDS, Clock, add_int8_base, add_int8_budget,
                          bench_config, build_nodes, emit, float_dtype_name, int8_report, interleaved_round,
                          matmul_peaks, minor_faults, model_gemm_shapes, peak_by_library, run_dtype, run_name,
                          run_quantize, settle_int8_base, shaped_checkpoint, timed_part)
from bench.harness.ct2_baseline import sweep_types
from bench.harness.flops import executed_mfu, score_flops
from bench.harness.openvino_baseline import is_int8
from shared.manifest import read_manifest

SAMPLES = 15
LABELS = torch.tensor([9454, 2152])  # two label ids ("yes"/"no" in Qwen's vocabulary)
PAD_ID = 0
HF_MICRO_BATCHES = (1, 4, 8, 15)  # 15: the whole request, i.e. careful (so best <= careful)
CT2_BATCH_SIZES = (1, 2, 4, SAMPLES)
OPENVINO_MICRO_BATCHES = (1, 4, SAMPLES)


def make_requests(count: int, samples: int, low: int, high: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        lengths = [rng.randint(low, high) for _ in range(samples)]
        requests.append([torch.tensor([rng.randrange(vocab) for _ in range(n)]) for n in lengths])
    return requests


def build_node(checkpoint, dtype_name: str, name: str, quantize=None):
    # int8 calibrates on random token ids (the benchmark's models have random weights), gated by the defaults
    return build_nodes(bench_config(checkpoint, dtype_name, quantize=quantize, **SCORE_BOUNDS), name).score


def sweep(fns: dict, give_up_factor: float | None = None) -> tuple[object, dict, dict]:
    """Time each candidate once on the same request, in order: the fastest key, the table (ms), the
    outputs. With give_up_factor, stop after a candidate that took that many times the best so far
    (CTranslate2's larger batches only get slower on mixed lengths, and each costs a long call)."""
    table, outputs = {}, {}
    for key, fn in fns.items():
        (seconds, value), = interleaved_round({key: fn}).values()
        table[key], outputs[key] = 1e3 * seconds, value
        if give_up_factor and table[key] > give_up_factor * min(table.values()):
            break
    return min(table, key=table.get), {str(k): round(v, 1) for k, v in table.items()}, outputs


class Contenders:
    """The four callables of one request, each returning what its parity check needs."""

    def __init__(self, node, hf, ct2, micro_batch: int, ct2_setting: tuple[str, int] | None,
                 onednn_micro_batch: int | None = None, openvino=None, openvino_setting: tuple[str, int] | None = None,
                 float_node=None, float_name: str = "bf16"):
        self.node, self.hf, self.ct2, self.openvino, self.float_node = node, hf, ct2, openvino, float_node
        self.float_name = float_name
        self.micro_batch, self.ct2_setting, self.onednn_micro_batch = micro_batch, ct2_setting, onednn_micro_batch
        self.openvino_setting = openvino_setting

    def for_request(self, samples: list[torch.Tensor]) -> dict:
        ids, lens = torch.cat(samples), torch.tensor([len(s) for s in samples])
        fns = {
            "ours": lambda: self.node(ids, lens, LABELS, 2),
            **({f"ours_{self.float_name}": lambda: self.float_node(ids, lens, LABELS, 2)}
               if self.float_node is not None else {}),
            "hf_careful": lambda: hf_side.careful(self.hf, samples, PAD_ID),
            "hf_best": lambda: hf_side.best(self.hf, samples, PAD_ID, self.micro_batch),
        }
        if self.onednn_micro_batch is not None:
            fns["hf_best_onednn"] = lambda: hf_best_onednn(self.hf, samples, self.onednn_micro_batch)
        if self.ct2_setting is not None:
            rows, (compute_type, batch) = self.ct2.strings(samples), self.ct2_setting
            fns["ct2"] = lambda: self.ct2.score(compute_type, rows, batch)
        if self.openvino_setting is not None:
            precision, micro_batch = self.openvino_setting
            fns["openvino"] = lambda: self.openvino.logits(precision, samples, micro_batch)
        return fns


def pick_settings(node, hf, ct2, request, reference: torch.Tensor | None) -> tuple[int, tuple[str, int] | None,
                                                                                  dict, dict]:
    """Warm every contender up on the first request and sweep the baselines' batching there.

    Returns the micro-batch, the CTranslate2 setting, the sweep tables and, for a bf16 run,
    CTranslate2's float32 outputs on that request (they check the converted model itself)."""
    warm_up = Contenders(node, hf, ct2, SAMPLES, None).for_request(request)
    interleaved_round({name: warm_up[name] for name in ("ours", "hf_careful")})
    fns = {m: (lambda m=m: hf_side.best(hf, request, PAD_ID, m)) for m in HF_MICRO_BATCHES}
    micro_batch, hf_table, _ = sweep(fns)
    report = {"hf_best_micro_batch_ms": hf_table}
    if ct2 is None:
        return micro_batch, None, report, {}
    rows = ct2.strings(request)
    types = sweep_types(ct2.offered, reference is not None)
    ct2.score(types[0], rows[:2], 1)  # warm-up
    batch, report["ct2_max_batch_size_ms"], _ = sweep({b: (lambda b=b: ct2.score(types[0], rows, b))
                                                       for b in CT2_BATCH_SIZES}, give_up_factor=2.0)
    if len(types) == 1:
        return micro_batch, (types[0], batch), report, {}
    for t in types[1:]:
        ct2.score(t, rows[:2], 1)  # warm-up
    by_type = {t: (lambda t=t: ct2.score(t, rows, batch)) for t in types}
    _, report["ct2_compute_type_ms"], outs = sweep(by_type)
    return micro_batch, (fastest_at_parity(report, outs, reference), batch), report, outs


def pick_openvino_setting(openvino, dtype: torch.dtype, request, int8: bool = False,
                          reference: torch.Tensor | None = None) -> tuple[tuple[str, int], dict]:
    """OpenVINO's precision (the run's; an int8 run: the faster of its own two int8 forms, NNCF weight compression and
    full quantization, that passes the quantized bound against `reference`, at the base's hint; both recorded under
    "int8_forms"; where neither passes, the base precision, its best setting within the bound) and its fastest
    micro-batch on the sweep's request (after a warm-up call)."""
    from bench.harness.openvino_baseline import fastest_int8, peer_precision

    precision, forms = fastest_int8(openvino, dtype, request, reference) if int8 else (None, None)
    precision = precision or peer_precision(dtype, False)
    openvino.logits(precision, request[:2], 1)  # compiles the model for this precision
    fns = {m: (lambda m=m: openvino.logits(precision, request, m)) for m in OPENVINO_MICRO_BATCHES}
    micro_batch, table, _ = sweep(fns, give_up_factor=2.0)
    return (precision, micro_batch), table | ({"int8_forms": forms} if forms else {})


def openvino_refused(sweeps: dict) -> dict:
    """{form: its failed check} of OpenVINO's int8 forms (pick_openvino_setting's "int8_forms")."""
    forms = sweeps.get("openvino_micro_batch_ms", {}).get("int8_forms") or {}
    return {form: r["check"] for form, r in forms.items() if not r["check"]["ok"]}


def openvino_label(setting: tuple[str, int] | None) -> str | None:
    if setting is None:
        return None
    precision, micro_batch = setting
    batching = "one sample per call" if micro_batch == 1 else f"length-sorted micro-batches of {micro_batch}"
    return f"{precision}, {batching} (right-padded), last token only, PERFORMANCE_HINT=LATENCY"


def hf_best_onednn(hf, samples: list[torch.Tensor], micro_batch: int) -> torch.Tensor:
    with hf_side.linears_on(hf, "onednn"):
        return hf_side.best(hf, samples, PAD_ID, micro_batch)


def pick_onednn_micro_batch(hf, request) -> tuple[int, dict]:
    """hf_best_onednn's own fastest micro-batch on the sweep's request (after a warm-up call)."""
    hf_best_onednn(hf, request, SAMPLES)
    micro_batch, table, _ = sweep({m: (lambda m=m: hf_best_onednn(hf, request, m)) for m in HF_MICRO_BATCHES})
    return micro_batch, table


def fastest_at_parity(report: dict, outs: dict, reference: torch.Tensor) -> str:
    """CTranslate2's fastest compute type whose outputs on the sweep's request pass their parity
    bound against the float32 reference (a quantized type that misses it computes something else:
    it is reported under ct2_compute_types_refused with its check, and not compared with)."""
    refused = {t: parity.quantized_check(f"ct2_{t}_top1_vs_fp32", *outs[t], reference) for t in outs if t != "float32"}
    report["ct2_compute_types_refused"] = {t: check for t, check in refused.items() if not check["ok"]}
    at_parity = [t for t in outs if t not in report["ct2_compute_types_refused"]]
    return min(at_parity, key=lambda t: report["ct2_compute_type_ms"][str(t)])


@dataclasses.dataclass
class Timed:
    """What time_requests measured."""

    seconds: dict  # name -> seconds per request: the mean over requests of each request's median round
    outputs: list[dict]  # per request, name -> the output of its first timed round
    by_round: dict  # name -> every round's seconds, request by request (the spread a noisy machine leaves)
    faults_by_round: dict  # name -> every round's minor page faults, likewise
    warm_up_faults: dict  # name -> the minor page faults of its untimed warm-up call


def time_requests(contenders: Contenders, requests, rounds: int = 1) -> Timed:
    """Every contender once on the first request, untimed, then per request `rounds` interleaved rounds
    (order rotated from round to round).

    The warm-up round comes right before the timed ones because the batching sweeps before them leave the
    process's heap as the last contender swept left it, and a contender whose buffers no longer fit it pays
    for fresh pages (minor faults: the kernel maps and zeroes each one) in its next call. Measured without
    it (Qwen3-0.6B bf16, 28 layers, 2 rounds): our first timed call took 117,941 faults and 11.02 s, our
    next calls of the same request 1 fault and 9.92 s; transformers careful's first took 125,665."""
    warm_up_faults: dict = {}
    warm_up = contenders.for_request(requests[0])
    interleaved_round({name: counting_faults(fn, warm_up_faults, name) for name, fn in warm_up.items()})
    by_round, faults_by_round, outputs, turn = {}, {}, [], 0
    for samples in requests:
        fns = contenders.for_request(samples)
        for r in range(rounds):
            names = list(fns)
            names = names[turn % len(names):] + names[: turn % len(names)]
            turn += 1
            faults = {}
            round_ = interleaved_round({n: counting_faults(fns[n], faults, n) for n in names})
            for table, values in ((by_round, {n: s for n, (s, _) in round_.items()}), (faults_by_round, faults)):
                for name, value in values.items():
                    per_request = table.setdefault(name, [])
                    if r == 0:
                        per_request.append([])
                    per_request[-1].append(value)
            if r == 0:
                outputs.append({name: value for name, (_, value) in round_.items()})
    seconds = {name: sum(statistics.median(s) for s in rows) / len(rows) for name, rows in by_round.items()}
    return Timed(seconds, outputs, by_round, faults_by_round, warm_up_faults)


def counting_faults(fn, faults: dict, name: str):
    """fn, recording in faults[name] the minor page faults its call took."""
    def call():
        before = minor_faults()
        value = fn()
        faults[name] = minor_faults() - before
        return value
    return call


def fp32_checks(outputs: list[dict]) -> list[dict]:
    checks = []
    for r, out in enumerate(outputs):
        careful = out["hf_careful"]
        checks.append(parity.close_check(f"ours_vs_hf_careful_label_logits[{r}]", out["ours"].label_logits,
                                         careful[:, LABELS], parity.FP32_ABS))
        checks.append(parity.close_check(f"hf_best_vs_hf_careful_logits[{r}]", out["hf_best"], careful,
                                         parity.FP32_ABS))
        if "hf_best_onednn" in out:
            checks.append(parity.close_check(f"hf_best_onednn_vs_hf_careful_logits[{r}]", out["hf_best_onednn"],
                                             careful, parity.FP32_ABS))
        checks.append(parity.top1_check(f"ours_top1_vs_hf_careful[{r}]", out["ours"].topk_ids[:, 0],
                                        out["ours"].topk_logprobs[:, 0], careful, parity.FP32_ABS))
        if "ct2" in out:
            checks.append(parity.top1_check(f"ct2_top1_vs_hf_careful[{r}]", *out["ct2"], careful, parity.FP32_ABS))
        if "openvino" in out:
            checks.append(parity.close_check(f"openvino_vs_hf_careful_logits[{r}]", out["openvino"], careful,
                                             parity.FP32_ABS))
    return checks


def reference_checks(out: dict, reference: torch.Tensor, ct2_type: str | None, ct2_sweep: dict) -> list[dict]:
    """Request 0 of a bf16 or int8 run against transformers in float32 on the same (in bf16: bf16-valued) weights,
    each side within 1.5x transformers' own error in the run's float dtype (bench/harness/parity.bf16_check; in an int8
    run on a float32 base that error is nil, so the bound is its floor); CTranslate2 in float32 (from its sweep)
    strictly, its timed compute type within its own bound. OpenVINO: openvino_accuracy."""
    ref_labels, careful = reference[:, LABELS], out["hf_careful"][:, LABELS]
    # an int8 run's float side (the int8 node has its own check)
    ours = next((name for name in ("ours_bf16", "ours_fp32") if name in out), "ours")
    checks = [parity.bf16_check(f"{ours}_label_logits_vs_fp32", out[ours].label_logits, careful, ref_labels),
              parity.bf16_check("hf_best_label_logits_vs_fp32", out["hf_best"][:, LABELS], careful, ref_labels)]
    if "float32" in ct2_sweep:
        checks.append(parity.top1_check("ct2_float32_top1_vs_fp32", *ct2_sweep["float32"], reference, parity.FP32_ABS))
    if "ct2" in out and ct2_type != "float32":
        checks.append(parity.quantized_check(f"ct2_{ct2_type}_top1_vs_fp32", *out["ct2"], reference))
    return checks


def openvino_accuracy(out: dict, reference: torch.Tensor, dtype: torch.dtype,
                      int8: bool = False) -> tuple[list[dict], dict | None]:
    """Request 0 of OpenVINO in a bf16 or int8 run against transformers in float32 on the same weights: (checks to
    assert, the check reported instead). An int8 run's OpenVINO (its own int8 weights) is asserted within the bound
    of every quantized contender, ours included (parity.quantized_check on its top-1). Else its label logits against
    the bf16 bound (bench/harness/parity.bf16_check): on a bfloat16 base reported, not asserted ("ok" becomes
    "within_bound"): a peer's bf16 less accurate than the bound is still the speed to beat."""
    if "openvino" not in out:
        return [], None
    if int8:
        logprobs = torch.log_softmax(out["openvino"].float(), dim=-1)
        ids = logprobs.argmax(-1)
        return [parity.quantized_check("openvino_int8_top1_vs_fp32", ids, logprobs.gather(1, ids[:, None])[:, 0],
                                       reference)], None
    check = parity.bf16_check("openvino_label_logits_vs_fp32", out["openvino"][:, LABELS],
                              out["hf_careful"][:, LABELS], reference[:, LABELS])
    if dtype == torch.float32:
        return [check], None
    return [], {("within_bound" if key == "ok" else key): value for key, value in check.items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=(*sorted(FLOAT_DTYPES), "int8"), default="fp32",
                        help="int8: the --int8-base model with [quantize] int8, against our node without it as well")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the real model's depth; quick 2)")
    parser.add_argument("--requests", type=int, help="timed requests of 15 samples (default 3, quick 1)")
    parser.add_argument("--quick", action="store_true", help="2 layers, samples of 32..160 tokens, 1 request")
    add_int8_budget(parser)
    add_int8_base(parser)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per request (default 1); each "
                        "request counts at its median round, every round is in ms_by_round")
    parser.add_argument("--threads", type=int, help="threads for every contender (default: torch's, one per core)")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out (speedup_vs_ct2 is null)")
    parser.add_argument("--no-openvino", action="store_true",
                        help="leave OpenVINO out (speedup_vs_openvino is null)")
    parser.add_argument("--build-only", action="store_true", help="write the checkpoint, compile the node, convert "
                        "it for CTranslate2 and OpenVINO (all cached in bench/.cache) and stop")
    return settle_int8_base(parser, parser.parse_args())


@dataclasses.dataclass
class Run:
    """What one benchmark run measures: its settings and the prepared contenders."""

    args: argparse.Namespace
    layers: int
    quick: bool
    sample_tokens: tuple[int, int]
    checkpoint: object
    spec: object
    node: object = None
    float_node: object = None  # int8 runs: the same model without int8 layers (in the base precision)
    quantized: dict | None = None  # int8 runs: the manifest's record of the int8 layers and the gate
    hf: object = None
    ct2: object = None
    openvino: object = None


def prepare(args) -> Run:
    """Checkpoint, compiled node, CTranslate2 and OpenVINO conversions (cached); transformers unless --build-only."""
    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    from bench.harness.ct2_baseline import Ct2Model
    from bench.harness.openvino_baseline import OpenVinoModel

    family, shape, depth = MODELS[args.model]
    layers = args.layers or (2 if args.quick else depth)
    dtype = run_dtype(args)
    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    run = Run(args, layers, args.quick or layers != depth, (32, 160 if args.quick else 480), checkpoint,
              read_spec(checkpoint))
    dtype_name = str(dtype).removeprefix("torch.")
    name = f"score-{run_name(args, layers)}"
    run.node = build_node(checkpoint, dtype_name, name, run_quantize(args))
    if args.dtype == "int8":
        run.quantized = read_manifest(CACHE / "artifacts" / name).quantize
        run.float_node = build_node(checkpoint, dtype_name, f"score-{args.model}-{args.int8_base}-{layers}l")
    run.ct2 = None if args.no_ct2 else Ct2Model(checkpoint, torch.get_num_threads())
    run.openvino = None if args.no_openvino else OpenVinoModel(checkpoint, torch.get_num_threads())
    if not args.build_only:
        run.hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    return run


def measure(run: Run, requests) -> dict:
    """Sweep the baselines' batching, time every contender interleaved, measure the peak around it."""
    dtype, clock = run_dtype(run.args), Clock()
    tokens = sum(len(sample) for sample in requests[0])
    peak_shapes = ((2048, 2048, 2048), *model_gemm_shapes(run.spec, tokens))  # a request's own shapes
    peak_before = matmul_peaks(dtype, peak_shapes)
    clock.lap("peak_before")
    reference = None
    if run.args.dtype != "fp32":  # transformers in float32 on the same weights (bf16-valued in bf16), request 0
        from transformers import AutoModelForCausalLM

        fp32 = AutoModelForCausalLM.from_pretrained(run.checkpoint, dtype=torch.float32).eval()
        reference = hf_side.careful(fp32, requests[0], PAD_ID)
        del fp32
    clock.lap("reference")
    micro_batch, ct2_setting, sweeps, ct2_sweep = pick_settings(run.node, run.hf, run.ct2, requests[0], reference)
    if run.float_node is not None:  # warm-up
        run.float_node(torch.cat(requests[0]), torch.tensor([len(s) for s in requests[0]]), LABELS, 2)
    onednn_micro_batch = None
    if run.args.dtype == "fp32":  # bf16 linears already run on oneDNN through aten
        onednn_micro_batch, sweeps["hf_best_onednn_micro_batch_ms"] = pick_onednn_micro_batch(run.hf, requests[0])
    openvino_setting = None
    if run.openvino is not None:
        openvino_setting, sweeps["openvino_micro_batch_ms"] = pick_openvino_setting(run.openvino, dtype, requests[0],
                                                                                    run.args.dtype == "int8", reference)
    clock.lap("warm_up_and_sweeps")
    contenders = Contenders(run.node, run.hf, run.ct2, micro_batch, ct2_setting, onednn_micro_batch,
                            run.openvino, openvino_setting, run.float_node, float_dtype_name(run.args))
    with timed_part():
        timed = time_requests(contenders, requests, run.args.rounds)
        seconds, outputs = timed.seconds, timed.outputs
    clock.lap("timed_requests")
    peak_after = matmul_peaks(dtype, peak_shapes)
    clock.lap("peak_after")
    drift = openvino_reported = None
    if run.args.dtype == "fp32":
        checks = fp32_checks(outputs)
    else:
        checks = reference_checks(outputs[0], reference, ct2_setting and ct2_setting[0], ct2_sweep)
        asserted, openvino_reported = openvino_accuracy(outputs[0], reference, dtype,
                                                        openvino_setting is not None and is_int8(openvino_setting[0]))
        checks += asserted
    if run.args.dtype == "int8":
        drift = int8_drift(run, outputs[0]["ours"], requests[0], reference)
        checks.append(parity.quantized_check("ours_int8_top1_vs_fp32", outputs[0]["ours"].topk_ids[:, 0],
                                             outputs[0]["ours"].topk_logprobs[:, 0], reference))
    clock.lap("parity")
    return {"seconds": seconds, "by_round": timed.by_round, "faults_by_round": timed.faults_by_round,
            "warm_up_faults": timed.warm_up_faults, "micro_batch": micro_batch,
            "onednn_micro_batch": onednn_micro_batch,
            "ct2": ct2_setting, "openvino": openvino_setting, "sweeps": sweeps, "checks": checks,
            "peaks": (peak_before, peak_after),
            "phase_seconds": clock.laps, "threads": threads_by_side(seconds, run.ct2), "int8_drift": drift,
            "openvino_accuracy": openvino_reported}


def int8_drift(run: Run, ours, request, reference: torch.Tensor) -> dict:
    """Label log-prob drift against transformers in float32 on the same weights (request 0): ours in int8, and
    CTranslate2's int8 on the same inputs (its score_batch: the label token's log-prob after the sample)."""
    ref = torch.log_softmax(reference, dim=-1)[:, LABELS]  # [B, labels]
    drift = {"max_label_logprob_drift": float((ours.label_logprobs - ref).abs().max()),
             "mean_label_logprob_drift": float((ours.label_logprobs - ref).abs().mean()),
             "ct2_max_label_logprob_drift": None}
    if run.ct2 is not None:
        theirs = run.ct2.label_logprobs("int8", run.ct2.strings(request), LABELS.tolist())
        drift["ct2_max_label_logprob_drift"] = float((theirs - ref).abs().max())
        drift["ct2_mean_label_logprob_drift"] = float((theirs - ref).abs().mean())
    return drift


def threads_by_side(seconds: dict, ct2) -> dict[str, int]:
    """The intra-op threads each contender ran with (torch's for ours, transformers and OpenVINO,
    whose INFERENCE_NUM_THREADS is set to it; the CTranslate2 generator's own)."""
    return {name: (ct2.threads if name == "ct2" else torch.get_num_threads()) for name in seconds}


def report(run: Run, requests, m: dict) -> dict:
    """The result JSON: the stable keys first, then what they were computed from."""
    seconds, checks, ct2 = m["seconds"], m["checks"], m["ct2"]
    peak, count = max(max(p.values()) for p in m["peaks"]), len(requests)
    flops = sum(score_flops(run.spec, [len(s) for s in r]) for r in requests) / count
    ratio = lambda name: seconds[name] / seconds["ours"] if name in seconds else None  # noqa: E731
    ours_checks = [c for c in checks if c["check"].startswith("ours_") and "label" in c["check"]]
    int8 = m["int8_drift"] or {}
    return {
        "bench": "score_node", "model": run.args.model, "layers": run.layers, "dtype": run.args.dtype,
        "int8_base": run.args.int8_base, "quick": run.quick,
        # int8 layers run integer dot products against a float peak: no single peak to divide by
        "executed_mfu": None if run.args.dtype == "int8" else executed_mfu(flops, seconds["ours"], peak),
        "speedup_vs_bf16": ratio("ours_bf16"), "speedup_vs_fp32": ratio("ours_fp32"),
        "max_label_logprob_drift": int8.get("max_label_logprob_drift"),
        "ct2_max_label_logprob_drift": int8.get("ct2_max_label_logprob_drift"), "int8_drift": m["int8_drift"],
        **int8_report(run.quantized),
        "speedup_vs_hf_careful": ratio("hf_careful"), "speedup_vs_hf_best": ratio("hf_best"),
        "speedup_vs_hf_best_onednn": ratio("hf_best_onednn"),
        "speedup_vs_ct2": ratio("ct2"), "ct2_compute_type": ct2 and ct2[0],
        "speedup_vs_openvino": ratio("openvino"), "openvino_setting": openvino_label(m["openvino"]),
        # in bf16 (and int8 on a bf16 base) OpenVINO's label logits against transformers in float32, reported, not
        # asserted: a peer less accurate than the bound is still the speed to beat (None on a float32 base, where
        # they are a parity check)
        "openvino_accuracy": m["openvino_accuracy"],
        "ct2_compute_types_refused": m["sweeps"].pop("ct2_compute_types_refused", {}),
        # an int8 run's OpenVINO int8 forms outside the quantized bound (then OpenVINO runs at the base precision)
        "openvino_int8_forms_refused": openvino_refused(m["sweeps"]),
        "max_abs_diff_vs_hf": max(c.get("max_abs_diff", c.get("error_vs_fp32", 0.0)) for c in ours_checks),
        "max_abs_diff_vs_hf_means": ("label logits against transformers in the same dtype" if run.args.dtype == "fp32"
                                     else "label logits against transformers in float32 on the same weights"
                                     + (" (of our node without int8 layers)" if run.args.dtype == "int8" else "")),
        "parity_ok": parity.all_ok(checks),
        "hidden": run.spec.hidden_size, "heads": run.spec.num_heads, "head_dim": run.spec.head_dim,
        "vocab": run.spec.vocab_size, "samples_per_request": SAMPLES, "sample_tokens": list(run.sample_tokens),
        "requests": count, "mean_tokens_per_request": sum(len(s) for r in requests for s in r) / count,
        "ms_per_request": {name: 1e3 * s for name, s in seconds.items()},
        "rounds_per_request": run.args.rounds,
        "ms_by_round": {name: [[round(1e3 * s, 1) for s in rows] for rows in per_request]
                        for name, per_request in m["by_round"].items()},
        "minor_faults_by_round": m["faults_by_round"], "warm_up_minor_faults": m["warm_up_faults"],
        "batching": {"ours": "one packed call per request", "hf_careful": f"one left-padded batch of {SAMPLES}",
                     "hf_best": f"length-sorted micro-batches of {m['micro_batch']}",
                     "hf_best_onednn": m["onednn_micro_batch"] and f"length-sorted micro-batches of "
                                                                    f"{m['onednn_micro_batch']}",
                     "ct2": ct2 and f"max_batch_size={ct2[1]} (sorted by length), {ct2[0]}",
                     "openvino": openvino_label(m["openvino"])},
        "gemm": gemm_labels(run.args, seconds),
        "sweeps_ms": m["sweeps"], "executed_gflop_per_request": flops / 1e9,
        "executed_gflops": flops / seconds["ours"] / 1e9, "peak_gflops": peak / 1e9,
        "peak_gflops_by_library": peak_by_library(m["peaks"]), "phase_seconds": m["phase_seconds"], "parity": checks,
    }


def gemm_labels(args, seconds: dict) -> dict[str, str]:
    """Which GEMM library each side's linear layers called."""
    from compile.linear import resolve_gemm

    dtype = float_dtype_name(args)
    aten = {"fp32": "MKL's sgemm (model.gemm = auto: without AVX-512 it beats oneDNN's)",
            "bf16": "aten's matmul (model.gemm = auto: oneDNN has no bfloat16 on this CPU)"}
    ours = {"onednn": "oneDNN matmul, weights prepacked at load (model.gemm = auto)", "aten": aten[dtype]}[
        resolve_gemm("auto", "cpu", run_dtype(args), "score")]
    if args.dtype == "int8":
        int8 = "oneDNN int8 (VNNI or AMX where the CPU has them, else AVX2 with 7-bit activations)"
        labels = {"ours": f"{int8} for the chosen layers; the rest: {ours}", f"ours_{dtype}": ours}
    else:
        labels = {"ours": ours}
    if dtype == "bf16":
        labels |= {"ct2": "its own", "openvino": "its own"}
        return {name: labels.get(name, "oneDNN (bfloat16 through aten)") for name in seconds}
    labels |= {"hf_careful": "torch default (MKL sgemm)", "hf_best": "torch default (MKL sgemm)",
               "hf_best_onednn": "oneDNN matmul, unpacked", "ct2": "its own",
               "openvino": "its own (oneDNN inside its CPU plugin)"}
    return {name: labels[name] for name in seconds}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock()
    run = prepare(args)
    if args.build_only:
        return
    clock.lap("prepare")
    requests = make_requests(args.requests or (1 if args.quick else 3), SAMPLES, *run.sample_tokens,
                             run.spec.vocab_size)
    measured = measure(run, requests)
    measured["phase_seconds"] = clock.laps | measured["phase_seconds"]
    result = report(run, requests, measured)
    emit(f"score_node-{run_name(args, run.layers)}" + ("-quick" if args.quick else ""), result,
         threads=measured["threads"])  # refuses (exit 1, nothing written) when parity failed


if __name__ == "__main__":
    main()
