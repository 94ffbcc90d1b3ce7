"""The tables bench/report.py renders: each a function from the committed results to Markdown lines.

Every figure comes from a result file and every row ends with that file's name, commit, machine class
and load (bench/harness/result_files.py), so a table cannot say what its files do not. A ratio is always the
one the file computed within its own run (interleaved contenders, same threads), never one across runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bench.harness.result_files import ResultFile

Results = dict[str, ResultFile]
HEADLINE_CLASS = "avx512-halfrate"
"""The machine class of the README's headline table: the one where every headline run was made on the same
node code (other classes: docs/benchmarks.md)."""
MODELS = {"qwen2.5-0.5b": "Qwen2.5-0.5B", "qwen3-0.6b": "Qwen3-0.6B"}
DTYPE_ORDER = {"fp32": 0, "bf16": 1, "int8": 2}
CLASS_ORDER = {"avx512-halfrate": 0, "amx": 1, "avx2": 2, "avx512": 3, "unrecorded": 4}
FROM = "result · commit · machine class (from) · load"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def seconds(ms: float | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.2f} s"


def times(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def of_bench(results: Results, bench: str, machine: str | None = None) -> list[ResultFile]:
    """The files of one benchmark (of one machine class), ordered by class, model and precision."""
    chosen = [r for r in results.values() if r.bench == bench and (machine is None or r.machine_class[0] == machine)]
    return sorted(chosen, key=lambda r: (CLASS_ORDER.get(r.machine_class[0], 9), r.data.get("model", ""),
                                         DTYPE_ORDER.get(r.data.get("dtype", ""), 9), r.name))


def model_name(result: ResultFile) -> str:
    model = result.data.get("model", "")
    return f"{MODELS.get(model, model)}, {result.data.get('layers')} layers"


def precision(result: ResultFile) -> str:
    """fp32, bf16, or int8 with its base and the selection budget its build was given."""
    data = result.data
    if data.get("dtype") != "int8":
        return str(data.get("dtype"))
    limits = data.get("int8_limits") or {}
    budget = limits.get("selection_max_drift", data.get("int8_budget"))
    budget_words = f"{budget:g}-nat budget" if budget is not None else "default budget"
    layers = f", {data['int8_layers']} linears" if data.get("int8_layers") else ""
    return f"int8 on {data.get('int8_base') or 'bf16'} ({budget_words}{layers})"


# --- scoring -------------------------------------------------------------------------------------------------

def score_cells(r: ResultFile) -> list[str]:
    """ours, OpenVINO, transformers at its best, CTranslate2, executed MFU: each peer with the ratio of its time
    to ours in the same run."""
    d, ms = r.data, r.data.get("ms_per_request") or {}
    ours = seconds(ms.get("ours"))
    base = d.get("int8_base") or "bf16"  # files written before int8_base existed were all on bf16
    if d.get("dtype") == "int8":
        against = d.get("speedup_vs_bf16") if base != "fp32" else d.get("speedup_vs_fp32")
        ours += f" ({times(against)} our {base})"

    def peer(key: str, ratio: str, what: str = "") -> str:
        if ms.get(key) is None:
            return "not run"
        return f"{seconds(ms[key])}{what} ({times(d.get(ratio))})"

    ct2_type = f", {d['ct2_compute_type']}" if d.get("ct2_compute_type") else ""
    mfu = "—" if d.get("executed_mfu") is None else f"{d['executed_mfu']:.3f} of {d['peak_gflops']:.0f} GFLOP/s"
    openvino = ""
    if d.get("dtype") == "int8" and d.get("openvino_setting"):  # its int8 form, or its base where both missed
        refused = " (its int8 forms outside the bound)" if d.get("openvino_int8_forms_refused") else ""
        openvino = f", {d['openvino_setting'].split(',')[0]}{refused}"
    return [ours, peer("openvino", "speedup_vs_openvino", openvino), peer("hf_best", "speedup_vs_hf_best"),
            peer("ct2", "speedup_vs_ct2", ct2_type), mfu]


SCORE_HEADER = ["ours, s per request", "OpenVINO", "transformers, best", "CTranslate2, fastest passing type",
                "executed MFU"]


def headline(results: Results) -> list[str]:
    """The README's table: scoring at every precision and beam search, on one machine class."""
    rows = [[f"score {model_name(r)}, {precision(r)}", *score_cells(r), r.source()]
            for r in of_bench(results, "score_node", HEADLINE_CLASS)]
    for r in of_bench(results, "beam_node", HEADLINE_CLASS):
        if "ct2" not in r.data["sides"]:
            continue  # a run without CTranslate2 is in docs/benchmarks.md's beam table
        sides, d = r.data["sides"], r.data
        rows.append([f"beam {model_name(r)}, fp32, W={d['W']}, {d['prompt_tokens']}-token prompt, one request",
                     seconds(sides["ours"]["single_ms"]), "not run",
                     f"{seconds(sides['hf']['single_ms'])} ({times(d['speedup_vs_hf_single'])})",
                     f"{seconds(sides['ct2']['single_ms'])}, float32 ({times(d['speedup_vs_ct2_single'])})",
                     f"{d['executed_mfu_single']:.3f} of {d['peak_gflops']:.0f} GFLOP/s", r.source()])
    return table(["run", *SCORE_HEADER, FROM], rows)


def score(results: Results) -> list[str]:
    """Every scoring result, every machine class."""
    rows = []
    for r in of_bench(results, "score_node"):
        d = r.data
        onednn = d.get("speedup_vs_hf_best_onednn")
        rows.append([r.machine_class[0], model_name(r), precision(r), *score_cells(r),
                     times(onednn) if onednn else "—", accuracy(d), r.source()])
    return table(["machine", "model", "precision", *SCORE_HEADER, "transformers best on oneDNN",
                  "accuracy against transformers", FROM], rows)


def accuracy(d: dict[str, Any]) -> str:
    """Float runs: label logits' largest difference from transformers (float32 runs: from transformers in float32;
    bf16: from transformers in float32 on the same weights). int8 runs: the label log-prob drift of ours and of
    CTranslate2's int8 on the same inputs, in nats."""
    if d.get("dtype") == "int8":
        ct2 = d.get("ct2_max_label_logprob_drift")
        theirs = "" if ct2 is None else f"; CTranslate2 int8 {ct2:.2f}"
        return f"drift {d['max_label_logprob_drift']:.2f} nats{theirs}"
    parity = d.get("max_abs_diff_vs_hf")
    return "—" if parity is None else f"{parity:.2g}"


# --- beam search ---------------------------------------------------------------------------------------------

def beam(results: Results) -> list[str]:
    rows = []
    for r in of_bench(results, "beam_node"):
        d, sides = r.data, r.data["sides"]
        ct2 = sides.get("ct2")
        rows.append([r.machine_class[0], model_name(r), "fp32",
                     seconds(sides["ours"]["single_ms"]),
                     f"{sides['ours']['best_requests_per_s']:.3f} ({sides['ours']['best_batch']} per call)",
                     f"{times(d['speedup_vs_hf_single'])} / {times(d['speedup_vs_hf_batched'])}",
                     "not run" if ct2 is None else
                     f"{times(d['speedup_vs_ct2_single'])} / {times(d['speedup_vs_ct2_batched'])}",
                     "identical" if d.get("identical_to_hf") else "differ", r.source()])
        for kind in ("bf16", "int8"):
            extra = d.get(kind)
            if not extra:
                continue
            side = sides[f"ours_{kind}"]
            against_ct2 = (f"{times(extra['speedup_vs_ct2_single'])} / {times(extra['speedup_vs_ct2_batched'])}"
                           if extra.get("speedup_vs_ct2_single") else "not run")
            rows.append([r.machine_class[0], model_name(r),
                         f"{kind} ({times(extra['speedup_vs_fp32_single'])} / "
                         f"{times(extra['speedup_vs_fp32_batched'])} our fp32)",
                         seconds(side["single_ms"]),
                         f"{side['best_requests_per_s']:.3f} ({side['best_batch']} per call)", "—", against_ct2,
                         f"{extra['candidates_changed']} of {extra['candidates']} candidates changed against our "
                         f"fp32 (best score {extra['best_score_max_abs_diff']:.2f} nats off)", r.source()])
    return table(["machine", "model", "precision", "ours, one request", "ours, best batching (req/s)",
                  "against transformers (single / batched)", "against CTranslate2 float32 (single / batched)",
                  "beams against transformers fp32", FROM], rows)


# --- shared prefix, profile, attention -------------------------------------------------------------------------

def shared_prefix(results: Results) -> list[str]:
    rows = [[r.machine_class[0], model_name(r), precision(r),
             number(d["shared_s_per_request"]) + " s", number(d["unshared_s_per_request"]) + " s",
             times(d["speedup_vs_unshared"]), times(d["flop_bound"]), times(d["speedup_vs_hf"]),
             f"{d['max_abs_diff_vs_unshared']:.2g}", r.source()]
            for r in of_bench(results, "shared_prefix") for d in [r.data]]
    return table(["machine", "model", "precision", "shared, per request", "unshared, per request",
                  "speed-up over unshared", "executed-FLOP bound", "against transformers careful",
                  "label logits, shared against unshared", FROM], rows)


def rerank(results: Results) -> list[str]:
    """bench/rerank.py's runs: ours, transformers and the fastest peer, each peer at its best setting; a --quick run
    (fewer layers, one round) is marked as the smoke run it is, not a figure."""
    rows = []
    for r in of_bench(results, "rerank"):
        d, best = r.data, r.data["seconds_best"]
        peer = d.get("best_peer")
        setting = (d.get("settings") or {}).get("ct2_compute_type") if peer == "ct2" else \
            (d.get("settings") or {}).get("openvino_precision") if peer == "openvino" else None
        peer_cell = "—" if peer is None else f"{PEERS.get(peer, peer)}{f' ({setting})' if setting else ''}: " \
                                             f"{best[peer]:.2f} s"
        not_run = [PEERS.get(left.split(":")[0], left) for left in d.get("peers_left_out") or []]
        peer_cell += f" ({', '.join(not_run)} not run)" if not_run else ""
        rows.append([r.machine_class[0], "quick (smoke run, not a figure)" if r.quick else "full", model_name(r),
                     str(d["dtype"]), f"{best['ours']:.2f} s",
                     f"{best['hf']:.2f} s", peer_cell, times(d["speedup_vs_hf"]), times(d["speedup_vs_best_peer"]),
                     "yes" if d["query_computed_once"] else "no", f"{d['max_abs_relevance_diff_vs_hf']:.2g}",
                     r.source()])
    return table(["machine", "run", "model", "precision", "ours", "transformers", "fastest peer", "against transformers",
                  "against the fastest peer", "query computed once", "relevance, ours against transformers fp32",
                  FROM], rows)


PEERS = {"openvino": "OpenVINO", "ct2": "CTranslate2"}


def profile(results: Results) -> list[str]:
    rows = []
    for r in of_bench(results, "profile_nodes"):
        s = r.data["score"]
        shares, of_peak = s.get("families_share") or {}, s.get("family_of_peak") or {}
        node_ms = s.get("node_ms") or s.get("eager_ms")
        gemm = None if "gemm" not in shares else shares["gemm"] + shares.get("gemm_int8", 0.0)
        attention = shares.get("attention")
        rest = None if gemm is None or attention is None else 1.0 - gemm - attention
        rows.append([r.machine_class[0], model_name(r), precision(r),
                     f"{seconds(node_ms)}{'' if s.get('node_ms') else ' (eager)'}",
                     share(gemm), share(attention), share(rest),
                     number(of_peak.get("gemm")), number(of_peak.get("gemm_int8")), number(of_peak.get("attention")),
                     attention_kernel(s), r.source()])
    return table(["machine", "model", "precision", "one request of 15 samples", "GEMMs (int8 and float)", "attention",
                  "the rest",
                  "float GEMMs, of peak", "int8 GEMMs, of int8 peak", "attention, of peak", "attention ran", FROM], rows)


def attention_kernel(score: dict) -> str:
    """The kernel or operator that took the attention family's most time (bench/profile_nodes.family_kernels), or
    "not recorded" for a file from before the profile named them."""
    ran = (score.get("family_kernels") or {}).get("attention")
    return f"`{ran[0]['kernel']}`" if ran else "not recorded"


def attention_op(results: Results) -> list[str]:
    rows = [[r.machine_class[0], MODELS.get(d["model"], d["model"]), d["dtype"],
             f"{d['median_ms']['ours']:.1f} ms", f"{d['median_ms']['sdpa']:.1f} ms",
             f"{d['median_ms']['flex']:.1f} ms" if d["median_ms"].get("flex") else "not run",
             number(d["of_peak"]["ours"]), r.source()]
            for r in of_bench(results, "attention_op") for d in [r.data]]
    return table(["machine", "model", "dtype", "ours", "SDPA per sample", "FlexAttention", "ours, of peak", FROM],
                 rows)


# --- A/B runs of the node ------------------------------------------------------------------------------------

AB_QUESTIONS = {
    "node_ab_score_qwen2.5-0.5b_fp32": "scoring node against the Python-operator node it replaced",
    "node_ab_score_qwen2.5-0.5b_bf16": "scoring node against the Python-operator node it replaced",
    "node_ab_shared_qwen2.5-0.5b_fp32": "shared-prefix node against the Python-operator node it replaced",
    "node_ab_beam_qwen2.5-0.5b_fp32": "beam node against the Python-operator node it replaced",
    "node_ab_score_qwen2.5-0.5b_bf16_b_aten": "B: linears on aten, unpacked, against prepacked oneDNN",
    "node_ab_score_qwen2.5-0.5b_fp32_b_aten": "B: linears on aten (MKL), unpacked, against prepacked oneDNN",
    "node_ab_beam_qwen2.5-0.5b_fp32_aten": "B: beam node on aten against prepacked oneDNN",
    "node_ab_beam_qwen2.5-0.5b_fp32_per_node": "B: the beam node `auto` builds against the same on prepacked oneDNN",
    "node_ab_score_qwen2.5-0.5b_bf16_block64": "B: 64-row attention blocks against 32",
    "node_ab_score_qwen2.5-0.5b_bf16_2l_epilogues": ("B: SiLU, the SwiGLU product and the residual adds as oneDNN "
                                                     "GEMM epilogues, against separate pointwise kernels (2 layers)"),
    "node_ab_score_qwen2.5-0.5b_fp32_2l_t1_token_rows": ("B: the node with per-token log-prob rows (2 unused a call) "
                                                          "against the one without (2 layers, 1 thread)"),
}


def node_ab(results: Results) -> list[str]:
    rows = [[r.machine_class[0], AB_QUESTIONS.get(r.key, r.key), d["workload"], d["dtype"],
             f"{d['a_median_s']:.2f} s", f"{d['b_median_s']:.2f} s", times(d["speedup"]),
             number(d.get("median_pair_ratio")), r.source()]
            for r in of_bench(results, "node_ab") for d in [r.data]]
    return table(["machine", "question", "workload", "dtype", "A, median call", "B, median call",
                  "B's speed-up", "median pair ratio", FROM], rows)


def epilogue_ab(results: Results) -> list[str]:
    """bench/epilogue_ab.py: one layer's MLP block with its pointwise work as GEMM epilogues against separate
    kernels, per call (median CPU time, and wall time)."""
    rows = [[r.machine_class[0], MODELS.get(d["model"], d["model"]), d["dtype"], str(d["tokens"]),
             str(r.run.get("threads")), f"{d['median_cpu_ms']['separate']:.1f} ms",
             f"{d['median_cpu_ms']['epilogues']:.1f} ms", times(d["speedup_cpu_time"]), times(d["speedup_wall"]),
             r.source()]
            for r in of_bench(results, "epilogue_ab") for d in [r.data]]
    return table(["machine", "model", "dtype", "tokens", "threads", "separate, CPU a call", "epilogues, CPU a call",
                  "speed-up (CPU time)", "speed-up (wall)", FROM], rows)


# --- overload ------------------------------------------------------------------------------------------------

POLICIES = ("admission", "edf_late_drop", "fcfs_late_drop", "edf_bounded", "edf_expiry")


def overload_policies(name: str) -> Callable[[Results], list[str]]:
    """One overload result's policy × load table: median goodput (smallest–largest window), p99, the shares
    refused, dropped and of compute wasted."""
    def render(results: Results) -> list[str]:
        r = results[name]
        d = r.data
        rows = []
        for policy in POLICIES:
            cells = []
            for load in d["loads"]:
                c = d["table"][policy][load]
                low, high = c["goodput_spread_rps"]
                cells.append(f"{c['goodput_rps']:.1f} ({low:.1f}–{high:.1f}); p99 {c['ok_p99_ms']:.0f} ms; "
                             f"refused {share(c['refused_share'])}; dropped {share(c['dropped_share'])}; "
                             f"wasted {share(c['wasted_share'])}")
            rows.append([f"`{policy}`", *cells])
        caption = [f"**{d['workload']}**: capacity {d['capacity_rps']:.1f} requests/s by the sweep, "
                   f"{d['windows']} windows per cell;", f"from {r.source()}"]
        return [*caption, "", *table(["policy", *d["loads"]], rows)]
    return render


def overload_summary(results: Results) -> list[str]:
    rows = []
    for r in sorted((r for r in results.values() if r.bench in ("overload", "overload_sim")),
                    key=lambda r: (r.bench, r.name)):
        d = r.data
        by_load = d.get("admission_over_best_ablation_by_load")
        goals = d.get("goals") or {}
        held = [g for g in goals.values() if isinstance(g, dict) and "holds" in g]
        rows.append([r.bench, d["workload"], d.get("shed_by_cost", d.get("admission_shed_by_cost", "—")),
                     f"{d['capacity_rps']:.1f}",
                     " / ".join(f"{times(v)}" for v in by_load.values()) if by_load else
                     f"2x: {times(d.get('admission_at_2x_over_best_ablation'))}",
                     share((d.get("wasted_compute_share") or {}).get("admission")),
                     f"{sum(g['holds'] for g in held)} of {len(held)}" if held else "—", r.source()])
    return table(["benchmark", "workload", "shed by cost", "capacity, requests/s",
                  "admission over the best ablation (1x / 2x / 4x)", "admission's wasted compute at 2x",
                  "goals held", FROM], rows)


def overload_replay(results: Results) -> list[str]:
    """The deterministic replay against the clairvoyant bound of its own world, per load; at 2x why the
    worker idles and the high priority's share."""
    r = results["overload-replay-trace"]
    d = r.data
    rows = [[load, f"{row['admission_served']} / {row['bound_served']} = {number(row['admission_over_bound'], 3)}",
             " / ".join(f"{c}: {number(v, 3)}" for c, v in row["admission_over_bound_schedule_by_class"].items()),
             times(row["admission_over_edf_late_drop"]),
             f"{per['admission_served']} / {per['bound_at_fastest_factor']} = {number(per['admission_over_bound'], 3)}",
             str(row["no_jitter_world_admission_served"])]
            for load, row in d["loads"].items() for per in [row["per_batch_jitter_world"]]]
    lines = [f"{d['world']}; {d['windows']} windows per load; from {r.source()}", "",
             *table(["load", "admission / bound (in-time answers)", "by class, over the bound's schedule",
                     "over `edf_late_drop`", "jitter per batch: admission / bound at the fastest factor",
                     "no jitter: admission"], rows)]
    split = d.get("worker_idle_split_at_2x")
    if split:
        parts = [("idle", "worker idle"), ("no_request_alive", "no request alive (the trace's gaps)"),
                 ("scheduler", "a servable request not yet sent (the scheduler's)"),
                 ("alive_nothing_servable", "alive requests all answered, in flight or too late")]
        lines += ["", *table(["2x, share of each window's span", "per window"],
                             [[what, " / ".join(share(v) for v in split[key])] for key, what in parts])]
    prio = d.get("priority_at_2x")
    if prio:
        lines += ["", f"Priorities at 2x ({share(prio['high_share_of_requests'])} of requests at priority 1): "
                      f"{prio['high_in_time_with_all']} in time with all traffic, {prio['high_in_time_alone']} "
                      f"alone (share {number(prio['priority_high_share'], 3)}), the bound alone "
                      f"{prio['high_bound_alone']} ({number(prio['high_with_all_over_bound_alone'], 3)})."]
    return lines


def overload_keys(results: Results) -> list[str]:
    """The issue's summary keys of each overload run that has them (bench/harness/overload_keys.py): replay
    against the bound, live against the ablation, time to refusal, two replicas with retries, replay against live."""
    lines: list[str] = []
    for r in sorted((r for r in results.values() if r.bench == "overload" and "replay_vs_live_max_rel_err" in r.data),
                    key=lambda r: r.name):
        d = r.data

        def by_load(values: dict[str, float | None] | None) -> str:
            return " / ".join(f"{load} {times(v)}" for load, v in (values or {}).items()) or "—"

        refused = d["time_to_refusal_ms"]["refused"].get("admission", {})
        expired = d["time_to_refusal_ms"]["answered_504"]
        client = d.get("time_to_refusal_client_ms", {}).get("refused", {}).get("admission")
        where = "gateway: body read to answer written" if client is not None else "client send to answer"
        ablation_504 = " / ".join(f"`{p}` {number(v['p99'], 1)}" for p, v in expired.items()
                                  if p != "admission" and v["count"])
        errors = d["replay_vs_live_max_rel_err"]
        rows = [
            ["admission over the clairvoyant bound (replay, fitted model)", by_load(d["admission_over_bound"])],
            ["admission's live in-time answers over that bound", by_load(d.get("admission_over_bound_live"))],
            ["admission over `edf_late_drop` (live, median goodput)", by_load(d["admission_over_edf_late_drop"])],
            [f"time to refusal, admission, p50 / p99 ({where})",
             f"{number(refused.get('p50'), 2)} / {number(refused.get('p99'), 2)} ms ({refused.get('count', 0)} refusals)"],
            *([["time to refusal, admission, p50 / p99 (client send to answer)",
                f"{number(client.get('p50'), 2)} / {number(client.get('p99'), 2)} ms"]] if client else []),
            ["time to the ablations' 504, p99", f"{ablation_504} ms" if ablation_504 else "—"],
            ["two replicas with retries at 2x: admission over `edf_late_drop`", times(d["pair_retry_over_edf_late_drop"])],
            ["high priority's in-time answers with the rest over alone (replay, 2x)", number(d["priority_high_share"], 3)],
            ["worker idle share per window at 2x (live)", " / ".join(share(v) for v in d["worker_idle_share_at_2x"] or [])],
            ["admission's wasted compute by load (live)",
             " / ".join(f"{load} {share(v)}" for load, v in d["admission_wasted_compute_share_by_load"].items())],
            ["replay against live, largest relative error per policy",
             " / ".join(f"`{p}` {share(v)}" for p, v in errors.items() if p != "max")],
            *([f"live noise: `{pair.split(' / ')[0]}` and `{pair.split(' / ')[1]}` schedule alike; in-time "
               "answers apart", " / ".join(f"{load} {share(v)}" for load, v in apart.items())]
              for pair, apart in (d.get("live_same_schedule_rel_diff") or {}).items()),
        ]
        lines += [f"**{d['workload']}**, capacity {d['capacity_rps']:.1f} requests/s, {d['windows']} windows per "
                  f"cell; from {r.source()}", "", *table(["figure", "value"], rows), ""]
    return lines[:-1]


def refusal_time(results: Results) -> list[str]:
    """bench/refusal_time.py: one in-process gateway's time from a refusal's body read to its answer written."""
    lines: list[str] = []
    for r in sorted((r for r in results.values() if r.bench == "refusal_time"), key=lambda r: r.name):
        d = r.data
        gateway, histogram, client, cpu = (d["time_to_refusal_ms"], d["from_metrics"], d["client_send_to_answer_ms"],
                                           d["loop_thread_cpu_ms"])
        full = d["full_collection_ms"]
        rows = [
            ["gateway, body read to answer written, p50 / p99 / p99.9 / max (each refusal)",
             f"{number(gateway['p50'], 3)} / {number(gateway['p99'], 2)} / {number(gateway['p999'], 2)} / "
             f"{number(gateway['max'], 2)} ms"],
            ["the same from the /metrics histogram, p50 / p99 (bucket-interpolated)",
             f"{number(histogram['p50_ms'], 3)} / {number(histogram['p99_ms'], 2)} ms"],
            ["client, send to answer, p50 / p99", f"{number(client['p50'], 3)} / {number(client['p99'], 2)} ms"],
            ["CPU of the loop's thread per refusal (gateway and client), p50 / p99",
             f"{number(cpu['p50'], 3)} / {number(cpu['p99'], 2)} ms"],
            ["one full garbage collection, startup heap frozen (as served) / not, worst of 3",
             f"{number(max(full['frozen']), 3)} / {number(max(full['unfrozen']), 1)} ms"],
        ]
        lines += [f"{d['requests']} refusals; from {r.source()}", "", *table(["figure", "value"], rows), ""]
    return lines[:-1]


def overload_goals(results: Results) -> list[str]:
    """The scheduler's goals, each beside its figures and whether it holds, read from the newest run of
    bench/overload.py (with the summary keys) of each workload, trace and uniform: its deterministic replay
    through the same scheduler object (on the latency model fitted on its live worker, against the
    clairvoyant bound) and its live windows. A goal a run does not measure says so; nothing here is typed,
    every figure is read from its file. Only the product's own runs count (`overload-<workload>`, on any machine
    class): a run written with --result-suffix measured a variant (a change tried and not kept, a switch off)."""
    lives = sorted((r for r in results.values() if r.bench == "overload" and "replay_vs_live_max_rel_err" in r.data
                    and r.key == f"overload-{r.data['workload']}"),
                   key=lambda r: r.run.get("date", ""))
    newest = {r.data["workload"]: r for r in lives}  # by date: the last of each workload stays
    runs = [newest[w] for w in ("trace", "uniform") if w in newest]

    def each(figure: Callable[[dict], dict], only: str | None = None) -> tuple[dict, list[ResultFile]]:
        """A figure of every workload's run (or of `only`'s), its keys prefixed by the workload."""
        chosen = [r for r in runs if only in (None, r.data["workload"])]
        return {f"{r.data['workload']} {k}": v for r in chosen for k, v in figure(r.data).items()}, chosen

    def replay_at(d: dict, field: str, loads: tuple[str, ...]) -> dict:
        return {load: d["replay"]["loads"][load][field] for load in loads if load in d["replay"]["loads"]}

    def refusal_p99(d: dict) -> dict:
        return {"p99": (d.get("time_to_refusal_ms") or {}).get("refused", {}).get("admission", {}).get("p99")}

    if not runs:
        return table(["goal", "bound", "measured", "holds", FROM], [])
    rows = [_goal("replay: admission over the clairvoyant bound, by load", ">= 0.9",
                  *each(lambda d: d["admission_over_bound"]), lambda v: v >= 0.9),
            _goal("replay: by deadline class over the bound's own schedule, lowest class", ">= 0.85",
                  *each(lambda d: {load: min(by.values()) for load, by in
                                   replay_at(d, "admission_over_bound_schedule_by_class", tuple(d["loads"])).items()}),
                  lambda v: v >= 0.85),
            _goal("replay: high priority with the rest over alone, 2x", ">= 0.95",
                  *each(lambda d: {"2x": d["priority_high_share"]}), lambda v: v >= 0.95),
            _goal("replay: worker idle while a servable request waited, 2x windows", "<= 10 %",
                  *each(lambda d: dict(enumerate(d["worker_idle_scheduler_share_at_2x_replay"] or [], 1))),
                  lambda v: v <= 0.10, share),
            _goal("replay: admission's wasted compute, 2x / 4x", "<= 1 %",
                  *each(lambda d: replay_at(d, "wasted_compute_share", ("2x", "4x"))), lambda v: v <= 0.01, share),
            _goal("live: admission over `edf_late_drop`, by load", ">= 0.98",
                  *each(lambda d: d["admission_over_edf_late_drop"]), lambda v: v >= 0.98),
            _goal("live: admission over the fair FCFS at 2x", ">= 1.3",
                  *each(lambda d: {"2x": (d.get("admission_over_fair_fcfs_by_load") or {}).get("2x")}, "trace"),
                  lambda v: v >= 1.3),
            _goal("live: time to refusal, p99 (ms)", "<= 2", *each(refusal_p99), lambda v: v <= 2),
            _goal("live: two replicas with retries over `edf_late_drop`'s pair, 2x", ">= 1.2",
                  *each(lambda d: {"2x": d["pair_retry_over_edf_late_drop"]}), lambda v: v >= 1.2),
            _goal("live: worker idle, 2x windows (the trace's gaps included)", "<= 10 %",
                  *each(lambda d: dict(enumerate(d.get("worker_idle_share_at_2x") or [], 1))), lambda v: v <= 0.10,
                  share),
            _goal("live: admission's wasted compute, 2x / 4x", "<= 1 %",
                  *each(lambda d: {k: v for k, v in (d.get("admission_wasted_compute_share_by_load") or {}).items()
                                   if k in ("2x", "4x")}), lambda v: v <= 0.01, share),
            _goal("live: replay against live, largest relative error of any policy", "<= 10 %",
                  *each(lambda d: {"max": d["replay_vs_live_max_rel_err"]["max"]}), lambda v: v <= 0.10, share)]
    return table(["goal", "bound", "measured", "holds", FROM], rows)


def _goal(what: str, bound: str, values: dict, sources: list[ResultFile], holds: Callable[[float], bool],
          shown: Callable[[float], str] = lambda v: number(v, 3)) -> list[str]:
    """One goal's row: every value (by workload, load, class or window), whether all of them hold, and the
    files they were read from."""
    measured = {k: v for k, v in values.items() if v is not None}
    source = " and ".join(r.source() for r in sources)
    if not measured:
        return [what, bound, "not measured", "—", source]
    cells = " / ".join(shown(v) if len(measured) == 1 else f"{k}: {shown(v)}" for k, v in measured.items())
    return [what, bound, cells, "yes" if all(holds(v) for v in measured.values()) else "**no**", source]


# --- serving, recovery, memory -------------------------------------------------------------------------------

def _serving_rows(results: Results) -> Iterable[list[str]]:
    def row(name: str, what: str, value: Callable[[dict[str, Any]], str]) -> list[str]:
        r = results[name]
        return [what, value(r.data), r.source()]

    yield row("detection", "a killed worker seen lost (SIGKILL, median over cases)",
              lambda d: " / ".join(f"{c['median_ms']:.1f} ms" for k, c in d["cases"].items() if "SIGKILL" in k))
    yield row("detection", "a frozen worker seen lost, worst case over the bound T",
              lambda d: f"{d['max_over_bound']:.3f} T")
    yield row("recovery", "SIGKILL to the replacement's first answer (min / median / max)",
              lambda d: " / ".join(f"{d['first_200_after_kill_s'][k]:.2f} s" for k in ("min", "median", "max")))
    yield row("gateway_overhead", "gateway's added latency, p50 / p99 (stand-in worker)",
              lambda d: f"{d['overhead_p50_ms']:.2f} / {d['overhead_p99_ms']:.2f} ms")
    yield row("gateway_overhead", "most requests/s through one gateway (text / token ids)",
              lambda d: f"{d['max_rps']:.0f} / {d['max_rps_pretokenized']:.0f}")
    yield row("gateway_overhead-telemetry-quick", "tracing on minus off: added latency p50, gateway CPU per request",
              lambda d: f"{d['on_minus_off_overhead_p50_ms']:.2f} ms, {d['on_minus_off_cpu_ms_per_request']:.2f} ms")
    yield row("gateway_overhead-telemetry-quick", "tracing on: event loop / exporter process CPU per request",
              lambda d: f"{d['loop_us_per_traced_request']:.0f} µs / {d['on_exporter_cpu_ms_per_request']:.2f} ms")
    for bodies, what in ((("score_15_texts", "score_15x500_ids"), "15 texts / 15 × 500 token ids"),
                         (("generate_prompt", "embeddings_8x200_ids"), "a generate prompt / 8 × 200 embeddings ids")):
        yield row("request_decode", f"CPU to decode a request body, {what}; the ref it was run against",
                  lambda d, bodies=bodies: _decode_us(d, bodies))
    yield row("protocol", "protocol's cost over raw ZeroMQ, p50 (ipc / tcp)",
              lambda d: f"{d['protocol_overhead_ipc_p50_us']:.1f} / {d['protocol_overhead_tcp_p50_us']:.1f} µs")
    yield row("prefix_cache-qwen2.5-0.5b-fp32-24l", "prefix cache: session goodput on over off (FLOP bound)",
              lambda d: f"{times(d['speedup_vs_cache_off'])} ({times(d['flop_bound'])})")
    yield row("prefix_cache-qwen2.5-0.5b-fp32-24l", "prefix cache: Zipf hit rate, 2 routed workers over 1",
              lambda d: number(d["routing_hit_rate_ratio"], 3))
    yield row("prefix_cache-qwen2.5-0.5b-fp32-24l", "prefix cache: change at zero reuse (closed loop, one run)",
              lambda d: share(d["zero_reuse_slowdown"]))
    yield row("cpu_lanes-qwen2.5-0.5b-bf16-24l", "two CPU lanes of 1 thread over one of 2: requests/s; median latency",
              lambda d: f"{times(d['throughput_two_lanes_over_one'])}; "
                        f"{d['median_latency_s']['two_lanes_1_thread']:.2f} s against "
                        f"{d['median_latency_s']['one_lane_2_threads']:.2f} s")
    yield row("runner_call-qwen2.5-0.5b-bf16-24l", "a request through the package runner over torch's loader (time)",
              lambda d: f"{times(d['runner_over_torch_time'])} ({d['median_request_s']['runner']:.2f} s against "
                        f"{d['median_request_s']['torch']:.2f} s)")
    yield row("gemm_ab_score_fp32_4l", "scoring node on oneDNN over aten, float32",
              lambda d: times(d["median_speedup_onednn_vs_aten"]))
    yield row("worker_memory-qwen2.5-0.5b-bf16-24l-avx512-halfrate",
              "CPU worker's resident set, largest rise without / with its limit",
              lambda d: " / ".join(f"{d['sides'][s]['max_resident_rise_gib']:.2f} GiB" for s in ("kept", "limited")))


def _decode_us(d: dict[str, Any], bodies: tuple[str, ...]) -> str:
    """This tree's median CPU µs per decode of `bodies`, then the first ref's, from the same run."""
    ref = next(iter(d["refs"]))
    def us(side: str) -> str:
        return " / ".join(f"{d['bodies'][b]['median_cpu_us'][side]:.1f}" for b in bodies)
    return f"{us('this tree')} µs; {ref}: {us(ref)} µs"


def serving(results: Results) -> list[str]:
    return table(["figure", "value", FROM], _serving_rows(results))


# --- the index -----------------------------------------------------------------------------------------------

def index(results: Results) -> list[str]:
    """Which file is current for which benchmark and machine class."""
    rows = [[f"`{r.name}`", r.bench, r.machine_class[0], r.machine_class[1], r.commit, r.date[:10],
             "—" if r.load_median is None else f"{r.load_median:g}", "yes" if r.quick else "no"]
            for r in sorted(results.values(), key=lambda r: (r.bench, r.name))]
    return table(["file", "benchmark", "machine class", "class from", "commit", "date", "load (median)", "smoke run"],
                 rows)


TABLES: dict[str, Callable[[Results], list[str]]] = {
    "headline": headline,
    "score": score,
    "beam": beam,
    "shared-prefix": shared_prefix,
    "rerank": rerank,
    "profile": profile,
    "attention-op": attention_op,
    "node-ab": node_ab,
    "epilogue-ab": epilogue_ab,
    "overload-summary": overload_summary,
    "overload-uniform": overload_policies("overload-uniform"),
    "overload-trace": overload_policies("overload-trace"),
    "overload-replay": overload_replay,
    "overload-keys": overload_keys,
    "refusal-time": refusal_time,
    "overload-goals": overload_goals,
    "serving": serving,
    "index": index,
}
