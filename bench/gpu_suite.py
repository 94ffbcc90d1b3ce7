"""The GPU suite: Qwen3-0.6B- and Qwen2.5-0.5B-shaped models, compiled, checked and measured in one run.

For each model: a random-weight checkpoint of the real shape (written by transformers), both nodes
(score, beam) compiled for the device with configs/compose-gpu.toml, parity with transformers
(label logits; beam candidates against generate(num_beams=W)), the scoring node against
transformers (15 samples per request, effective MFU), the beam node (W = 100, S = 4, short prompts)
against generate, the end-to-end stack (python -m worker + python -m gateway, open-loop HTTP at the
seed system's rates), and selective FP8 (compile/fp8.py: layers ranked by measured label-probability
change on a calibration set, chosen under a budget; eager timing of the FP8 model against bf16; then
the scoring node compiled with `[model] fp8` against the bf16 node: speed and label-probability change).

    .venv/bin/python bench/gpu_suite.py                 # on one CUDA GPU, bf16 (meant for < 10 min)
    .venv/bin/python bench/gpu_suite.py --cpu-smoke     # the same steps on the CPU, 1 layer, small loads

Writes bench/results/gpu_suite.json (gpu_suite_cpu_smoke.json), updated after every stage so a run
cut short keeps what it measured; the last printed line is the JSON. Targets (seed system, one H200):
scoring ≥ 100 req/s at mean < 20 ms, p99 < 70 ms; beam W=100 S=4 ≥ 300 req/s; scoring MFU ≥ 0.67.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import traceback

import torch

from common import CACHE, QWEN25_05B, QWEN3_06B, RESULTS, ROOT, emit, shaped_checkpoint
from e2e_stack import Stack, run_load
from gpu_measure import Settings, beam_bench, fp8_node_bench, fp8_report, parity, score_bench

MODELS = {"qwen3-0.6b": ("qwen3", QWEN3_06B, 28), "qwen2.5-0.5b": ("qwen2", QWEN25_05B, 24)}
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def settings_for(args) -> Settings:
    if args.cpu_smoke:
        return Settings(device="cpu", dtype=torch.bfloat16, layers=args.layers or 1, sample_tokens=(16, 64),
                        score_requests=2, batch_requests=(1, 2), beam_prompts=(8, 24), beam_batches=(1, 2),
                        e2e_seconds=3.0, score_rate=2.0, beam_rate=1.0, calibration_batches=2, repeats=1, fp8_budget=0.2,
                        bounds=dict(max_samples_per_batch=32, max_tokens_per_batch=2048, max_beam_width=100,
                                    max_beam_requests_per_batch=4, max_prompt_tokens=64))  # >= 3: see compile/beam/module.py export
    return Settings(device="cuda", dtype=torch.bfloat16, layers=args.layers, sample_tokens=(32, 480),
                    score_requests=16, batch_requests=(1, 2, 4), beam_prompts=(8, 32), beam_batches=(1, 4, 8),
                    e2e_seconds=10.0, score_rate=100.0, beam_rate=300.0, calibration_batches=4, repeats=5, fp8_budget=0.02,
                    bounds=dict(max_samples_per_batch=64, max_tokens_per_batch=32768, max_beam_width=128,
                                max_beam_requests_per_batch=8, max_prompt_tokens=512))


def build(checkpoint, name: str, s: Settings, fp8_budget: float | None = None):
    """Both nodes for the device with the GPU deployment config (bounds from the settings).

    With fp8_budget: the scoring node alone, built with `[model] fp8` under that budget.
    """
    from compile.build import build as build_artifacts
    from shared.config import load_config

    config = load_config(ROOT / "configs/compose-gpu.toml")
    model = dataclasses.replace(config.model, path=str(checkpoint), device=s.device,
                                dtype=str(s.dtype).removeprefix("torch."))
    if fp8_budget is not None:
        model = dataclasses.replace(model, fp8=True, fp8_max_prob_change=fp8_budget)
        config = config.replace(beam=dataclasses.replace(config.beam, enabled=False))
    config = config.replace(model=model, bounds=dataclasses.replace(config.bounds, **s.bounds),
                            worker=dataclasses.replace(config.worker, endpoints=("ipc:///tmp/unused",), devices=("cpu",)))
    out = CACHE / "artifacts" / f"suite-{name}-{s.device}"
    start = time.perf_counter()
    build_artifacts(config, out)
    return config, out, time.perf_counter() - start


def peak_flops(s: Settings) -> dict:
    """Measured large-matmul FLOP/s of the dtype on the device, and the datasheet figure if known."""
    size = 8192 if s.device == "cuda" else 2048
    a = torch.randn(size, size, dtype=s.dtype, device=s.device)
    sync = torch.cuda.synchronize if s.device == "cuda" else (lambda: None)
    torch.mm(a, a), sync()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        torch.mm(a, a)
        runs += 1
    sync()
    measured = 2 * size**3 * runs / (time.perf_counter() - start)
    name = torch.cuda.get_device_name() if s.device == "cuda" else "cpu"
    sheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
    return {"device_name": name, "measured_matmul_flops": measured, "datasheet_bf16_flops": sheet}


def e2e(config, artifacts, s: Settings, vocab: int, name: str) -> dict:
    from gpu_measure import beam_bodies, score_bodies

    folder = CACHE / "e2e" / name
    with Stack(config, artifacts, s.device, folder) as stack:
        stack.wait_ready(600)
        result = {}
        for route, rate, bodies in (("/v1/score", s.score_rate, score_bodies(s, vocab, int(s.score_rate * s.e2e_seconds))),
                                    ("/v1/generate", s.beam_rate, beam_bodies(s, vocab, int(s.beam_rate * s.e2e_seconds)))):
            run_load(stack.url, route, bodies[: max(4, len(bodies) // 10)], rate)  # warm the route
            result[route] = run_load(stack.url, route, bodies, rate)
    return result


def targets(model: dict, s: Settings) -> dict:
    if s.device != "cuda":
        return {"applicable": False, "why": "targets are for one H200; this is the CPU smoke run"}
    score, beam = model.get("e2e", {}).get("/v1/score", {}), model.get("e2e", {}).get("/v1/generate", {})
    mfu = model.get("score", {}).get("best_effective_mfu_datasheet")
    return {
        "applicable": True,
        "score_100rps_mean_lt_20ms_p99_lt_70ms": bool(score and score["goodput_per_s"] >= 100
                                                      and (score["mean_ms"] or 1e9) < 20 and (score["p99_ms"] or 1e9) < 70),
        "beam_300rps": bool(beam and beam["goodput_per_s"] >= 300),
        "score_mfu_ge_0.67": bool(mfu is not None and mfu >= 0.67),
    }


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
    from compile.runtime import load_nodes

    nodes = load_nodes(artifacts, "cuda:0" if s.device == "cuda" else "cpu")
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=s.dtype).to(s.device).eval()
    steps = [("parity", lambda: parity(nodes, hf, spec, s)), ("score", lambda: score_bench(nodes, hf, spec, s, peak)),
             ("beam", lambda: beam_bench(nodes, hf, spec, s)),
             ("fp8", lambda: fp8_report(checkpoint, spec, s)),
             ("fp8_node", lambda: fp8_node_bench(nodes, spec, s, build(checkpoint, f"{key}-{layers}l-fp8", s, s.fp8_budget))),
             ("e2e", lambda: e2e(config, artifacts, s, spec.vocab_size, key))]
    for name, step in steps:
        if name in skip:
            continue
        try:
            entry[name] = step()
        except Exception as exc:  # one failing stage must not hide the others' figures
            entry[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        stage(name)
        save(result, out_name)
    del hf, nodes
    entry["targets"] = targets(entry, s)


def save(result: dict, name: str) -> None:
    import json

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every step on the CPU with 1 layer and small loads")
    parser.add_argument("--layers", type=int, help="override the layer count (default: the real model's; 1 with --cpu-smoke)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--skip", default="", help="comma-separated stages to skip: parity,score,beam,fp8,fp8_node,e2e")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu-smoke on a machine without a GPU")
    s = settings_for(args)
    out_name = "gpu_suite_cpu_smoke" if args.cpu_smoke else "gpu_suite"
    torch.manual_seed(0)
    start = time.perf_counter()
    peak = peak_flops(s)
    result = {"bench": "gpu_suite", "cpu_smoke": args.cpu_smoke, "device": peak["device_name"],
              "dtype": str(s.dtype).removeprefix("torch."), "torch": torch.__version__, "peak": peak, "models": {}}
    for key in args.models.split(","):
        run_model(key, s, peak, result, out_name, set(filter(None, args.skip.split(","))))
    result["total_seconds"] = round(time.perf_counter() - start, 1)
    emit(out_name, result)


if __name__ == "__main__":
    main()
