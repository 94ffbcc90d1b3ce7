"""The GPU suite: Qwen3-0.6B- and Qwen2.5-0.5B-shaped models, compiled, checked and measured in one run.

For each model: a random-weight checkpoint of the real shape (written by transformers), both nodes
(score, beam) compiled for the device with configs/compose-gpu.toml, parity with transformers
(label logits and the top beam against float32 on the same weights, within transformers' own bf16
error; bench/harness/parity.py), no host sync inside either node's call (each enqueue run
under torch.cuda.set_sync_debug_mode("error")) and two lanes' streams overlapping (the time of two
concurrent batches against one; bench/harness/gpu_checks.py), the scoring node against transformers
careful and at its best (15 samples per request, executed MFU), the beam node (W = 100, S = 4,
short prompts) against generate() one prompt per call and batched, the end-to-end stack (python -m
worker + python -m gateway, open-loop Poisson HTTP load at the seed system's rates and at 0.5-4x the
node's measured capacity, a different seed per point), and selective FP8 (compile/fp8.py; then the
scoring node compiled with `[model] fp8` against the bf16 node: speed and label-probability change).

    .venv/bin/python bench/gpu_suite.py                 # on one CUDA GPU, bf16 (meant for <= 8 min)
    .venv/bin/python bench/gpu_suite.py --cpu-smoke     # the same steps on the CPU, 1 layer, small loads
    .venv/bin/python bench/gpu_suite.py --cpu-smoke --only parity   # one stage (after the build; a -partial file)

Writes bench/results/gpu_suite.json (gpu_suite_cpu_smoke.json; a run that skips a stage writes the name
with -partial, so the whole run's file never mixes runs), updated after every stage so a run cut short keeps
what it measured; the last printed line is the JSON; exits non-zero when any stage crashes, a parity check
(label logits or the top beam) fails or a call syncs the host. Goodput = answers within the SLO
(70 ms, also each request's deadline) per second of the offered window, so it can never exceed the
offered rate. Targets (the seed system on one H200, each one a perfect system meets): at 100
scoring requests/s offered, >= 95 % of them answered within the SLO and their mean < 20 ms; the
same at 300 beam requests/s (W=100, S=4); scoring executed MFU >= 0.67 of the measured bf16 matmul
peak (the seed quotes 67 % "effective" MFU, which counts more work than was executed, so this is the
stricter reading).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from bench.harness.common import (CACHE, MODELS, bench_config, build_artifacts, emit, load_built, matmul_peak_flops,
                          shaped_checkpoint, these_threads)
from bench.harness.provenance import RESULTS, provenance
from bench.harness.e2e_stack import Stack, run_load
from bench.harness.gpu_checks import lane_overlap, no_host_sync
from bench.harness.gpu_measure import Settings, beam_bench, fp8_node_bench, fp8_report, parity, score_bench

STAGES = ("parity", "no_host_sync", "lane_overlap", "score", "beam", "fp8", "fp8_node", "e2e")
"""Every stage of a model's run, in order (--skip and --only name them)."""
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
MAX_OFFERED_PER_S = 3000.0  # one asyncio client process; its send lag is reported beside each point


def settings_for(args) -> Settings:
    if args.cpu_smoke:
        return Settings(device="cpu", dtype=torch.bfloat16, layers=args.layers or 1, sample_tokens=(16, 64),
                        score_requests=2, batch_requests=(1, 2), beam_prompts=(8, 24), beam_batches=(1, 2),
                        e2e_seconds=3.0, score_rate=2.0, beam_rate=1.0, load_multipliers=(0.5, 3.0), slo_ms=20_000.0,
                        # fp8_budget 1.0 admits every layer (probabilities change by at most 1): the smoke checks
                        # that an FP8 node compiles, runs and is timed, which a budget choosing none would not
                        calibration_batches=2, repeats=1, fp8_budget=1.0,
                        bounds=dict(max_samples_per_batch=32, max_tokens_per_batch=2048, max_beam_width=100,
                                    max_beam_requests_per_batch=4, max_prompt_tokens=64))  # >= 3: see compile/beam/module.py export
    return Settings(device="cuda", dtype=torch.bfloat16, layers=args.layers, sample_tokens=(32, 480),
                    score_requests=16, batch_requests=(1, 2, 4), beam_prompts=(8, 32), beam_batches=(1, 4, 8),
                    e2e_seconds=6.0, score_rate=100.0, beam_rate=300.0, load_multipliers=(0.5, 1.0, 2.0, 4.0),
                    slo_ms=70.0, calibration_batches=4, repeats=5, fp8_budget=0.02,
                    bounds=dict(max_samples_per_batch=64, max_tokens_per_batch=32768, max_beam_width=128,
                                max_beam_requests_per_batch=8, max_prompt_tokens=512))


def build(checkpoint, name: str, s: Settings, fp8_budget: float | None = None):
    """Both nodes for the device with the GPU deployment config (configs/compose-gpu.toml, bounds
    from the settings), by bench's one builder: (config, artifacts folder, compile seconds).

    With fp8_budget: the scoring node alone, built with `[model] fp8` under that budget.
    """
    config = these_threads(bench_config(checkpoint, str(s.dtype).removeprefix("torch."),
                                        ("score",) if fp8_budget is not None else None, device=s.device,
                                        base="compose-gpu", fp8_budget=fp8_budget, **s.bounds))
    start = time.perf_counter()
    artifacts = build_artifacts(config, f"suite-{name}-{s.device}")
    return config, artifacts, time.perf_counter() - start


def refresh_peak(peak: dict, s: Settings) -> dict:
    """Measure the peak again and keep the best figure seen (a busy moment must not lower it)."""
    peak["measured_matmul_flops"] = max(peak["measured_matmul_flops"], peak_flops(s)["measured_matmul_flops"])
    return peak


def peak_flops(s: Settings) -> dict:
    """Measured large-matmul FLOP/s of the dtype on the device (best of short bursts), and the
    datasheet figure if known."""
    if s.device != "cuda":
        return {"device_name": "cpu", "measured_matmul_flops": matmul_peak_flops(s.dtype), "datasheet_bf16_flops": None}
    size, best = 8192, 0.0
    a = torch.randn(size, size, dtype=s.dtype, device=s.device)
    torch.mm(a, a), torch.cuda.synchronize()
    for _ in range(3):
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.5:
            torch.mm(a, a)
            runs += 1
        torch.cuda.synchronize()
        best = max(best, 2 * size**3 * runs / (time.perf_counter() - start))
    name = torch.cuda.get_device_name()
    sheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
    return {"device_name": name, "measured_matmul_flops": best, "datasheet_bf16_flops": sheet}


def offered_rates(target: float, capacity: float | None, s: Settings) -> list[float]:
    """The seed's rate and multiples of the node's measured capacity (capped for one client)."""
    rates = {target} | {m * capacity for m in s.load_multipliers if capacity}
    return sorted(min(r, MAX_OFFERED_PER_S) for r in rates)


def e2e(config, artifacts, s: Settings, vocab: int, name: str, capacity: dict) -> dict:
    """Per route, open-loop load at each offered rate for e2e_seconds, each point with its own seed."""
    from bench.harness.gpu_measure import beam_bodies, score_bodies

    routes = (("/v1/score", s.score_rate, score_bodies, 100), ("/v1/generate", s.beam_rate, beam_bodies, 200))
    folder = CACHE / "e2e" / name
    with Stack(config, artifacts, s.device, folder) as stack:
        result = {}
        for route, target, make_bodies, seed in routes:
            run_load(stack.url, route, make_bodies(s, vocab, 8, seed - 1), target, seed - 1, s.slo_ms)  # warm up
            points = []
            for i, rate in enumerate(offered_rates(target, capacity.get(route), s)):
                bodies = make_bodies(s, vocab, max(8, int(rate * s.e2e_seconds)), seed + i)
                points.append(run_load(stack.url, route, bodies, rate, seed + i, s.slo_ms) | {"target_rate": rate})
            result[route] = {"target_offered_per_s": target, "capacity_requests_per_s": capacity.get(route),
                             "points": points}
    return result


def at_target(route: dict) -> dict | None:
    return next((p for p in route.get("points", []) if p["target_rate"] == route["target_offered_per_s"]), None)


def targets(model: dict, s: Settings) -> dict:
    """Each target is one a perfect system meets: goodput is compared with the offered rate."""
    if s.device != "cuda":
        return {"applicable": False, "why": "targets are for one H200; this is the CPU smoke run"}
    e2e = model.get("e2e", {})

    def slo_met(route: str) -> bool:
        point = at_target(e2e.get(route, {}))
        return bool(point and point["goodput_per_s"] >= 0.95 * point["offered_per_s"] and point["mean_ms"] is not None
                    and point["mean_ms"] < 20)

    mfu = model.get("score", {}).get("executed_mfu")
    return {"applicable": True, "score_100rps_95pct_within_70ms_mean_lt_20ms": slo_met("/v1/score"),
            "beam_300rps_95pct_within_70ms_mean_lt_20ms": slo_met("/v1/generate"),
            "score_executed_mfu_ge_0.67": bool(mfu is not None and mfu >= 0.67)}


def run_model(key: str, s: Settings, peak: dict, result: dict, out_name: str, skip: set[str]) -> None:
    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    family, shape, full_layers = MODELS[key]
    layers = s.layers or full_layers
    entry = result["models"].setdefault(key, {"family": family, "layers": layers})
    stage = lambda n: entry.setdefault("stage_seconds", {}).__setitem__(n, round(time.perf_counter() - t0, 1))  # noqa: E731
    t0 = time.perf_counter()
    checkpoint = shaped_checkpoint(family, shape, layers, s.dtype)
    spec = read_spec(checkpoint)
    entry["vocab"], entry["hidden"] = spec.vocab_size, spec.hidden_size
    stage("checkpoint")
    config, artifacts, entry["compile_s"] = build(checkpoint, f"{key}-{layers}l", s)
    stage("compile")
    nodes = load_built(artifacts, config, runners=2)  # two lanes at once
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=s.dtype).to(s.device).eval()
    capacity = lambda: {"/v1/score": entry.get("score", {}).get("capacity_requests_per_s"),  # noqa: E731
                        "/v1/generate": entry.get("beam", {}).get("capacity_requests_per_s")}
    steps = [("parity", lambda: parity(nodes, hf, reference_model(checkpoint, s), spec, s)),
             ("no_host_sync", lambda: no_host_sync(nodes, spec, s)),
             ("lane_overlap", lambda: lane_overlap(nodes, spec, s, 4 if s.device == "cpu" else 20)),
             ("score", lambda: score_bench(nodes, hf, spec, s, refresh_peak(peak, s))),
             ("beam", lambda: beam_bench(nodes, hf, spec, s, refresh_peak(peak, s))),
             ("fp8", lambda: fp8_report(checkpoint, spec, s)),
             ("fp8_node", lambda: fp8_node_bench(nodes, spec, s, build(checkpoint, f"{key}-{layers}l-fp8", s, s.fp8_budget))),
             ("e2e", lambda: e2e(config, artifacts, s, spec.vocab_size, key, capacity()))]
    run_stages(entry, steps, skip, lambda name: (stage(name), save(result, out_name)))
    del hf, nodes
    entry["targets"] = targets(entry, s)


def run_stages(entry: dict, steps: list, skip: set[str], after_each=lambda name: None) -> None:
    """Each (name, step) not skipped, its result under entry[name]. A stage that raises is recorded as
    {"error", "trace"} and the next runs (one crash must not hide the others' figures); failures()
    counts every such record, so a crashed stage fails the suite."""
    for name, step in steps:
        if name in skip:
            continue
        try:
            entry[name] = step()
        except Exception as exc:
            entry[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        after_each(name)


def reference_model(checkpoint, s: Settings):
    """transformers in float32 on the same weights: the reference parity bounds the bf16 sides by."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(s.device).eval()


def save(result: dict, name: str) -> None:
    """The result so far (a run cut short keeps what it measured)."""
    import json

    RESULTS.mkdir(parents=True, exist_ok=True)
    partial = {**result, "run": provenance(result["quick"], torch.get_num_threads())}
    (RESULTS / f"{name}.json").write_text(json.dumps(partial, indent=2, default=str))


def failures(result: dict) -> list[str]:
    """Every stage that crashed, a parity check that failed (label logits or the top beam), an FP8 node with no
    FP8 layer (nothing measured), a host sync inside a call, and any goodput above its offered rate (a counting
    error)."""
    found = []
    for key, model in result["models"].items():
        for stage in STAGES:
            if isinstance(model.get(stage), dict) and "error" in model[stage]:
                found.append(f"{key}: stage {stage} crashed ({model[stage]['error'].splitlines()[0][:200]})")
        parity = model.get("parity", {})
        if parity.get("ok") is False:
            failed = [name for name in ("score", "beam") if isinstance(parity.get(name), dict) and not parity[name]["ok"]]
            found.append(f"{key}: parity ({', '.join(failed) or 'ok false'})")
        if isinstance(model.get("fp8_node"), dict) and "measured_nothing" in model["fp8_node"]:
            found.append(f"{key}: stage fp8_node measured nothing ({model['fp8_node']['measured_nothing']})")
        if model.get("no_host_sync", {}).get("ok") is False:
            found.append(f"{key}: a host sync inside a node call")
        for route, load in model.get("e2e", {}).items():
            if isinstance(load, dict):
                found += [f"{key} {route}: goodput above offered" for p in load.get("points", [])
                          if p["goodput_per_s"] > p["offered_per_s"] + 1e-9]
    return found


def skipped_stages(skip: str, only: str) -> set[str]:
    """The stages a run skips, from --skip and --only (comma-separated names of STAGES; not both). A name that is
    no stage is refused: a typo must not run, or skip, what its author did not mean."""
    skip_names, only_names = [n for n in skip.split(",") if n], [n for n in only.split(",") if n]
    unknown = [n for n in skip_names + only_names if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}: the stages are {', '.join(STAGES)}")
    if skip_names and only_names:
        raise ValueError("--skip and --only together: name the stages to run with --only alone")
    return set(STAGES) - set(only_names) if only_names else set(skip_names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every step on the CPU with 1 layer and small loads")
    parser.add_argument("--layers", type=int, help="override the layer count (default: the real model's; 1 with --cpu-smoke)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--skip", default="", help=f"comma-separated stages to skip: {','.join(STAGES)}")
    parser.add_argument("--only", default="", help="comma-separated stages to run, the others skipped (a run that "
                                                   "skips any writes <name>-partial.json, never the whole run's file)")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu-smoke on a machine without a GPU")
    try:
        skip = skipped_stages(args.skip, args.only)
    except ValueError as exc:
        parser.error(str(exc))
    s = settings_for(args)
    out_name = ("gpu_suite_cpu_smoke" if args.cpu_smoke else "gpu_suite") + ("-partial" if skip else "")
    torch.manual_seed(0)
    start = time.perf_counter()
    peak = peak_flops(s)
    result = {"bench": "gpu_suite", "cpu_smoke": args.cpu_smoke, "quick": args.cpu_smoke or args.layers is not None,
              "device": peak["device_name"], "slo_ms": s.slo_ms,
              "dtype": str(s.dtype).removeprefix("torch."), "torch": torch.__version__, "peak": peak, "models": {}}
    for key in args.models.split(","):
        run_model(key, s, peak, result, out_name, skip)
    result["total_seconds"] = round(time.perf_counter() - start, 1)
    result["failures"] = failures(result)
    emit(out_name, result)
    if result["failures"]:
        sys.exit("gpu suite failed: " + ", ".join(result["failures"]))


if __name__ == "__main__":
    main()
