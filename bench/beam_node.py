"""Bounded beam search: our compiled beam node against transformers generate(), in one run.

Model: Qwen2.5-0.5B's layer shapes (vocab 151,936) with fewer layers, random weights, float32 (so
that "identical" can be checked to the last token). Each request: one prompt of 64 or 256 tokens,
W = 100 beams, S = 4 new tokens, k = 4 candidates returned. The baseline is transformers'
generate(num_beams=W, max_new_tokens=S, do_sample=False), one request per call, which repeats the
prompt for every beam before prefill; our node prefills it once and shares its K/V with all beams.
ours_requests_per_s counts batches of 4 requests per node call (the compiled batch bound; 1 with --quick).
Also: a sweep of our node over W and prompt length, and a breakdown of where a call's time goes.

    .venv/bin/python bench/beam_node.py [--quick] [--layers 8] [--no-sweep]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from common import QWEN25_05B, ROOT, CACHE, emit, matmul_peak_flops, median, shaped_checkpoint, time_calls

W, S, K = 100, 4, 4


def build_node(checkpoint, name: str, max_width: int):
    from compile.build import build
    from compile.runtime import load_nodes
    from shared.config import BeamConfig, ScoreConfig, load_config

    config = load_config(ROOT / "configs/test.toml")
    bounds = dataclasses.replace(config.bounds, max_beam_width=max_width, max_new_tokens=S, max_prompt_tokens=512,
                                 max_beam_requests_per_batch=4)
    model = dataclasses.replace(config.model, path=str(checkpoint), dtype="float32")
    config = config.replace(model=model, bounds=bounds, score=ScoreConfig(enabled=False), beam=BeamConfig(enabled=True))
    build(config, CACHE / "artifacts" / name)
    return load_nodes(CACHE / "artifacts" / name)


def hf_generate(model, prompt: torch.Tensor, width: int):
    with torch.inference_mode():
        out = model.generate(
            prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=width,
            num_return_sequences=K, max_new_tokens=S, do_sample=False, return_dict_in_generate=True,
            output_scores=True,
        )
    return out.sequences[:, len(prompt):], out.sequences_scores


def same_as_hf(ours, row: int, hf_out, eos_ids) -> bool:
    tokens, scores = hf_out
    for j in range(K):
        n = int(ours.lengths[row, j])
        if ours.sequences[row, j, :n].tolist() != tokens[j, :n].tolist():
            return False
        if n < S and tokens[j, n - 1].item() not in eos_ids:
            return False
    return bool(torch.allclose(ours.scores[row], scores.float(), atol=1e-4, rtol=0))


def run_ours(node, prompts: list[torch.Tensor], width: int):
    return node(torch.cat(prompts), torch.tensor([len(p) for p in prompts]), width, S, K)


def compare(nodes, hf, prompts_by_len, hf_requests: int, batch: int) -> dict:
    """Per prompt length: HF and our requests/s on the same prompts, and whether outputs agree.

    The two are timed interleaved (one HF request, then one of our batches and one single request)
    so that both see the same load on a shared machine."""
    eos = tuple(nodes.manifest["nodes"]["beam"]["eos_ids"])
    rows, identical = {}, True
    for length, prompts in prompts_by_len.items():
        ours = run_ours(nodes.beam, prompts[:batch], W)  # also the warm-up call
        hf_times, batch_times, single_times, same = [], [], [], True
        for i, p in enumerate(prompts[:hf_requests]):
            hf_outs = []
            hf_times += time_calls(lambda: hf_outs.append(hf_generate(hf, p, W)), repeats=1, warmup=0)
            same &= same_as_hf(ours, i, hf_outs[0], eos)
            batch_times += time_calls(lambda: run_ours(nodes.beam, prompts[:batch], W), repeats=1, warmup=0)
            if batch > 1:
                single_times += time_calls(lambda: run_ours(nodes.beam, prompts[:1], W), repeats=1, warmup=0)
        single_times = single_times or batch_times
        identical &= same
        rows[length] = {
            "hf_s_per_request": median(hf_times), "ours_batch": batch, "ours_batch_s": median(batch_times),
            "ours_single_latency_s": median(single_times), "ours_requests_per_s": batch / median(batch_times),
            "hf_requests_per_s": 1 / median(hf_times), "identical_to_hf": same,
        }
        rows[length]["speedup"] = rows[length]["ours_requests_per_s"] / rows[length]["hf_requests_per_s"]
        print(f"prompt {length}: {rows[length]}", flush=True)
    return {"by_prompt_tokens": rows, "identical_to_hf": identical}


def sweep(node, vocab: int, widths, lengths, repeats: int) -> list[dict]:
    """Our node alone, one request per call: how the latency grows with W and prompt length."""
    g = torch.Generator().manual_seed(1)
    points = []
    for length in lengths:
        prompt = torch.randint(0, vocab, (length,), generator=g)
        for width in widths:
            seconds = median(time_calls(lambda: run_ours(node, [prompt], width), repeats=repeats))
            points.append({"W": width, "prompt_tokens": length, "latency_ms": 1e3 * seconds})
            print(f"sweep W={width} L={length}: {1e3 * seconds:.1f} ms", flush=True)
    return points


def profile(checkpoint, length: int, width: int) -> dict:
    """Where one request's time goes, timed piece by piece on the eager building blocks (ms)."""
    from compile.beam.decode import decode, prefill, prompt_kv
    from compile.checkpoint import load_checkpoint
    from compile.model import build_model

    ckpt = load_checkpoint(checkpoint, "float32")
    model = build_model(ckpt.spec, ckpt.state_dict, torch.float32)
    ids = torch.randint(0, ckpt.spec.vocab_size, (length,))
    cu = torch.tensor([0, length], dtype=torch.int32)
    index, valid = torch.arange(length)[None], torch.ones(1, length, dtype=torch.bool)
    with torch.inference_mode():
        _, keys, values = prefill(model, ids, torch.arange(length), cu)
        prompt = (prompt_kv(keys, index), prompt_kv(values, index), valid)
        tokens, pos = torch.randint(0, 1000, (1, width)), torch.full((1, width), length)
        hidden = torch.randn(width, ckpt.spec.hidden_size)
        logits = torch.randn(1, width, ckpt.spec.vocab_size)
        suffix = decode(model, tokens, pos, prompt, None)[1]
        parts = {
            "prefill": lambda: prefill(model, ids, torch.arange(length), cu),
            "decode_step_incl_lm_head": lambda: decode(model, tokens, pos + 1, prompt, suffix),
            "lm_head_only": lambda: model.logits(hidden),
            "log_softmax_topk": lambda: torch.topk(torch.topk(F.log_softmax(logits, -1), 2 * width)[0].reshape(1, -1),
                                                   2 * width),  # as compile/beam/search.py selects
        }
        out = {name: 1e3 * median(time_calls(fn, repeats=3)) for name, fn in parts.items()}
    out["per_request_estimate"] = out["prefill"] + (S - 1) * out["decode_step_incl_lm_head"] + S * out["log_softmax_topk"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 layer, 64-token prompts, one request per call, small sweep (about a minute once built)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 8, quick 1)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the W x prompt-length sweep")
    args = parser.parse_args()
    layers = args.layers or (1 if args.quick else 8)
    torch.manual_seed(0)
    checkpoint = shaped_checkpoint("qwen2", QWEN25_05B, layers, torch.float32)
    nodes = build_node(checkpoint, f"beam-qwen25shape-{layers}l", 400)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    vocab = nodes.manifest["model"]["vocab_size"]
    g = torch.Generator().manual_seed(0)
    lengths = [64] if args.quick else [64, 256]
    prompts = {n: [torch.randint(0, vocab, (n,), generator=g) for _ in range(4)] for n in lengths}
    result = compare(nodes, hf, prompts, hf_requests=1 if args.quick else 2, batch=1 if args.quick else 4)
    widths, sweep_lengths = ([8, 32], [64]) if args.quick else ([8, 32, 100, 400], [64, 256, 480])
    points = [] if args.no_sweep else sweep(nodes.beam, vocab, widths, sweep_lengths, repeats=1)
    main_len = 64 if args.quick else 256
    head = result["by_prompt_tokens"][main_len]
    emit("beam_node", {
        "ours_requests_per_s": head["ours_requests_per_s"], "hf_requests_per_s": head["hf_requests_per_s"],
        "speedup": head["speedup"], "W": W, "S": S, "k": K, "prompt_tokens": main_len,
        "identical_to_hf": result["identical_to_hf"], "layers": layers, "dtype": "float32",
        "threads": torch.get_num_threads(), "fp32_matmul_gflops": matmul_peak_flops(torch.float32, seconds=1.0) / 1e9,
        "by_prompt_tokens": result["by_prompt_tokens"], "sweep": points,
        "profile_ms": profile(checkpoint, main_len, W), "quick": args.quick,
    })


if __name__ == "__main__":
    main()
