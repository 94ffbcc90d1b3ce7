"""Generative reranking (the /v1/rerank workload): 1 query x 100 documents, each document's relevance
P(yes) / (P(yes) + P(no)) at the last token of its prompt.

Model: Qwen2.5-0.5B's shapes at its real depth, 24 layers (or --layers N), random weights written by
transformers, float32 or bfloat16. Work (fixed seed): the prompt of every document is the template's
head and the query (a shared prefix of HEAD + QUERY tokens), then the document (64..256 tokens), then
the template's tail (TAIL tokens): what gateway/api/reranking.py sends for a Qwen3-Reranker-style
template. Contenders, each at its best setting, timed interleaved (order rotated each round), same threads:
  ours         our scoring node, the request as the shared prefix once + 100 suffixes (what the gateway
               sends: one compiled batch holds the 100 prompts here);
  hf           transformers on the 100 full prompts, length-sorted left-padded micro-batches, the last
               position projected (bench/harness/hf_baselines.best), its fastest micro-batch of MICRO_BATCHES;
  openvino     OpenVINO on the same prompts, right-padded length-sorted micro-batches, last position
               (bench/harness/openvino_baseline), its own precision hint of the run (f32, or bf16: AMX's
               bfloat16 where the CPU has it), its fastest micro-batch of MICRO_BATCHES;
  ct2          CTranslate2 with the query as its static prompt (its shared-prefix path: the prompt's state
               computed once, cached) and each document + tail as a row, the last position's vocabulary
               scores (bench/harness/ct2_baseline.last_logits); float32 in a float32 run; in a bfloat16 run
               every compute type it offers on this CPU (it has no bfloat16 on a CPU), the fastest that
               passes the run's bound (the bound every bf16 contender is held to).
The settings are picked on the first SWEEP_DOCUMENTS documents (each setting timed once after an untimed
warm-up call; `sweeps` holds the table). A peer that is not installed (the bench extra) is left out and
named; speedup_vs_best_peer is against the fastest of those run (null when none was). Parity before any
figure (bench/harness/parity.py): every side's yes/no label logits against transformers' float32 (fp32:
within FP32_ABS, and ours' relevance within 1e-4; bf16: the bf16 bound); CTranslate2's as the difference
yes - no (its scores are log-probabilities); else the run exits non-zero and writes nothing.
query_computed_once: the node reported (documents - 1) x prefix tokens as cached, i.e. the query and
template head were computed once for the 100 documents.

    .venv/bin/python bench/rerank.py [--dtype fp32|bf16] [--layers N] [--rounds R] [--no-ct2] [--no-openvino]
                                     [--quick]

--quick (2 layers, 1 round) is a smoke run that the build and parity hold; it is not a headline figure.
"""

from __future__ import annotations

import argparse
import random

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness import parity
from bench.harness.common import (FLOAT_DTYPES, MODELS, bench_config, build_nodes, emit, interleaved_round,
                                  shaped_checkpoint)

DOCUMENTS = 100
DOCUMENT_TOKENS = (64, 256)
HEAD, QUERY, TAIL = 48, 16, 12
"""Tokens of the template's head (system message, instruction), the query, the template's tail."""
LABELS = torch.tensor([9454, 2152])  # "yes", "no" in Qwen's vocabulary
PAD_ID = 0
MICRO_BATCHES = (16, 4, 1)
"""hf's and OpenVINO's micro-batch sizes swept (the first is the one a careful user starts from)."""
SWEEP_DOCUMENTS = 16
"""Documents of the request each peer's settings are picked on."""
RELEVANCE_ABS = 1e-4
BOUNDS = dict(max_samples_per_batch=DOCUMENTS, max_tokens_per_sample=512, max_tokens_per_batch=32768,
              max_prefix_tokens=512)


def make_request(vocab: int, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(shared prefix: head + query, [document + tail] * DOCUMENTS) as token ids (fixed seed)."""
    rng = random.Random(seed)
    ids = lambda n: torch.tensor([rng.randrange(vocab) for _ in range(n)])  # noqa: E731
    prefix, tail = ids(HEAD + QUERY), ids(TAIL)
    return prefix, [torch.cat([ids(rng.randint(*DOCUMENT_TOKENS)), tail]) for _ in range(DOCUMENTS)]


def relevance(label_logits: torch.Tensor) -> torch.Tensor:
    """P(yes) / (P(yes) + P(no)) per document, float64, from [B, 2] yes/no logits."""
    return torch.sigmoid(label_logits[:, 0].double() - label_logits[:, 1].double())


def contenders(node, hf, openvino, ct2, settings: dict, prefix: torch.Tensor, suffixes: list[torch.Tensor]) -> dict:
    """name -> a call returning [B, 2] yes/no scores (CTranslate2's: its last-position scores, as its API gives)."""
    full = [torch.cat([prefix, s]) for s in suffixes]
    compact = torch.cat([prefix, *suffixes])
    suffix_lens = torch.tensor([len(s) for s in suffixes])
    one_group = (torch.tensor([len(prefix)]), torch.tensor([len(suffixes)]))
    fns = {"ours": lambda: node(compact, suffix_lens, LABELS, 1, *one_group),
           "hf": lambda: hf_side.best(hf, full, PAD_ID, settings["hf_micro_batch"])[:, LABELS]}
    if openvino is not None:
        fns["openvino"] = lambda: openvino.logits(settings["openvino_precision"], full,
                                                  settings["openvino_micro_batch"])[:, LABELS]
    if ct2 is not None:
        rows, static_prompt = ct2.strings(suffixes), ct2.strings([prefix])[0]  # token strings made before timing
        fns["ct2"] = lambda: ct2.last_logits(settings["ct2_compute_type"], rows, static_prompt)[:, LABELS]
    return fns


def peers(args, checkpoint, threads: int) -> tuple[object, object, list[str]]:
    """The installed peers (OpenVINO, CTranslate2) and what was left out, and why."""
    missing, openvino, ct2 = [], None, None
    missing += ["openvino: left out by --no-openvino"] if args.no_openvino else []
    missing += ["ct2: left out by --no-ct2"] if args.no_ct2 else []
    if not args.no_openvino:
        try:
            from bench.harness.openvino_baseline import OpenVinoModel

            openvino = OpenVinoModel(checkpoint, threads)
        except SystemExit as exc:
            missing.append(f"openvino: {exc}")
    if not args.no_ct2:
        try:
            from bench.harness.ct2_baseline import Ct2Model

            ct2 = Ct2Model(checkpoint, threads)
        except SystemExit as exc:
            missing.append(f"ct2: {exc}")
    return openvino, ct2, missing


def margin_check(dtype: str, reference: torch.Tensor, hf_same_dtype: torch.Tensor, labels: torch.Tensor = LABELS):
    """check(name, scores [B, 2] or [B, V]) -> the run's bound on the difference yes - no (of `labels` in a [B, V])
    against `reference`'s (transformers in float32, [B, 2]): FP32_ABS in fp32, the bf16 bound (transformers' own
    bf16 error, `hf_same_dtype` [B, 2]) in bf16."""
    def margin(scores: torch.Tensor) -> torch.Tensor:
        pair = scores[:, labels] if scores.shape[1] > 2 else scores
        return pair[:, 0] - pair[:, 1]

    if dtype == "bf16":
        return lambda name, got: parity.bf16_check(name, margin(got), margin(hf_same_dtype), margin(reference))
    return lambda name, got: parity.close_check(name, margin(got), margin(reference), parity.FP32_ABS)


def pick_settings(dtype: str, hf, hf32, openvino, ct2, prefix: torch.Tensor, suffixes: list[torch.Tensor]) -> tuple[dict, dict]:
    """Each peer's setting, picked on the first SWEEP_DOCUMENTS documents (bench/harness/peer_settings): (settings,
    the sweeps' tables)."""
    from bench.harness import peer_settings

    part = suffixes[:SWEEP_DOCUMENTS]
    full = [torch.cat([prefix, s]) for s in part]
    settings, sweeps = {}, {}
    settings["hf_micro_batch"], sweeps["hf_micro_batch_ms"] = peer_settings.hf_micro_batch(hf, full, PAD_ID, MICRO_BATCHES)
    if openvino is not None:
        settings["openvino_precision"] = "bf16" if dtype == "bf16" else "f32"
        settings["openvino_micro_batch"], sweeps["openvino_micro_batch_ms"] = peer_settings.openvino_micro_batch(
            openvino, settings["openvino_precision"], full, MICRO_BATCHES)
    if ct2 is not None:
        from bench.harness.ct2_baseline import sweep_types

        hf_part = hf_side.best(hf, full, PAD_ID, settings["hf_micro_batch"])[:, LABELS]
        reference = hf_part if hf32 is hf else hf_side.best(hf32, full, PAD_ID, settings["hf_micro_batch"])[:, LABELS]
        settings["ct2_compute_type"], sweeps["ct2_compute_type_ms"], sweeps["ct2_compute_types_refused"] = (
            peer_settings.ct2_compute_type(ct2, sweep_types(ct2.offered, below_float32=dtype != "fp32"),
                                           ct2.strings(part), ct2.strings([prefix])[0],
                                           margin_check(dtype, reference, hf_part)))
    return settings, sweeps


def checks_for(outputs: dict, reference: torch.Tensor, dtype: str) -> list[dict]:
    """Every side's yes/no logits against transformers in float32 (CTranslate2's as the difference yes - no, which
    log-softmax leaves as it is); ours' relevance within RELEVANCE_ABS in fp32."""
    checks = []
    for name, value in outputs.items():
        got = value.label_logits if name == "ours" else value
        if name == "ct2":
            checks.append(margin_check(dtype, reference, outputs["hf"])("ct2_yes_minus_no_vs_fp32", got))
        elif dtype == "bf16":
            checks.append(parity.bf16_check(f"{name}_label_logits_vs_fp32", got, outputs["hf"], reference))
        else:
            checks.append(parity.close_check(f"{name}_label_logits_vs_fp32", got, reference, parity.FP32_ABS))
    if dtype == "fp32":
        checks.append(parity.close_check("ours_relevance_vs_hf", relevance(outputs["ours"].label_logits),
                                         relevance(reference), RELEVANCE_ABS))
    return checks


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(FLOAT_DTYPES), default="fp32")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the real model's depth; quick 2)")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 2, quick 1)")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    parser.add_argument("--no-openvino", action="store_true", help="leave OpenVINO out")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 layers, 1 round (not a headline)")
    parser.add_argument("--threads", type=int, help="threads for every contender (default: one per core)")
    return parser.parse_args()


def timed_rounds(fns: dict, rounds: int) -> tuple[dict[str, list[float]], dict]:
    """`rounds` interleaved rounds, the order rotated each round: (name -> seconds of each round, name -> the
    last round's output). The sweeps before them were every contender's warm-up (ours': its call below)."""
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    outputs = {}
    for round_ in range(rounds):
        names = list(fns)[round_ % len(fns):] + list(fns)[: round_ % len(fns)]
        for name, (s, value) in interleaved_round({n: fns[n] for n in names}).items():
            seconds[name].append(s)
            outputs[name] = value
    return seconds, outputs


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    family, shape, depth = MODELS[args.model]
    layers = args.layers or (2 if args.quick else depth)
    quick = args.quick or layers != depth
    dtype = FLOAT_DTYPES[args.dtype]
    from transformers import AutoModelForCausalLM

    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    config = bench_config(checkpoint, str(dtype).removeprefix("torch."), **BOUNDS)
    node = build_nodes(config, f"rerank-{args.model}-{layers}l-{args.dtype}").score
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    hf32 = hf if args.dtype == "fp32" else AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    openvino, ct2, missing = peers(args, checkpoint, torch.get_num_threads())
    prefix, suffixes = make_request(shape["vocab_size"])
    settings, sweeps = pick_settings(args.dtype, hf, hf32, openvino, ct2, prefix, suffixes)
    fns = contenders(node, hf, openvino, ct2, settings, prefix, suffixes)
    fns["ours"]()  # ours' warm-up (the peers' were their sweeps)
    seconds, outputs = timed_rounds(fns, args.rounds or (1 if args.quick else 2))
    full = [torch.cat([prefix, s]) for s in suffixes]
    reference = outputs["hf"] if hf32 is hf else hf_side.best(hf32, full, PAD_ID, settings["hf_micro_batch"])[:, LABELS]
    checks = checks_for(outputs, reference, args.dtype)
    best = {name: min(s) for name, s in seconds.items()}
    peer_names = [n for n in best if n not in ("ours", "hf")]
    best_peer = min(peer_names, key=lambda n: best[n]) if peer_names else None
    cached = int(outputs["ours"].cached_tokens.sum())
    result = {
        "bench": "rerank", "model": args.model, "layers": layers, "dtype": args.dtype, "quick": quick,
        "documents": DOCUMENTS, "document_tokens": list(DOCUMENT_TOKENS), "prefix_tokens": len(prefix),
        "tail_tokens": TAIL, "prompt_tokens": sum(len(prefix) + len(s) for s in suffixes),
        "rounds": len(seconds["ours"]), "seconds_best": best, "seconds_all": seconds,
        "speedup_vs_hf": best["hf"] / best["ours"],
        "best_peer": best_peer, "speedup_vs_best_peer": best[best_peer] / best["ours"] if best_peer else None,
        "peers_left_out": missing, "settings": settings, "sweeps": sweeps,
        "cached_tokens": cached, "query_computed_once": cached == (DOCUMENTS - 1) * len(prefix),
        "max_abs_relevance_diff_vs_hf": float((relevance(outputs["ours"].label_logits) - relevance(reference)).abs().max()),
        "batched": "ours: one call of the 100 prompts sharing their prefix; hf and openvino: length-sorted "
                   "micro-batches of their swept size; ct2: the prefix as its cached static prompt, one document "
                   "per batch",
        "parity": checks,
    }
    emit(f"rerank-{args.model}-{layers}l-{args.dtype}{'-quick' if args.quick else ''}", result)
    failed = [c["check"] for c in checks if not c["ok"]]
    if failed:
        raise SystemExit(f"parity failed: {failed}")


if __name__ == "__main__":
    main()
