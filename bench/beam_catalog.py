"""The beam node with its catalogue as inputs against the same node with the catalogue compiled in, and the
time a worker takes to swap in a 1M-item catalogue (`bench/beam_node.py --runtime-constraints ...`).

Catalogue: --items synthetic semantic ids (default 1,000,000) of 3 or 4 tokens, each position drawn from a
codebook of --codebook ids (default 256) of its own range of the vocabulary, as generative retrieval's ids
are; duplicates removed by the trie.
  speedup_vs_constant_tables  seconds per call of the node compiled with the tables as constants (as
        `[beam] constraints` built it before catalogues became data; its package here is built by the
        product's build chain with a node builder of this file's) over the product's node, tables as
        inputs sized by the bounds (max_catalog_nodes = the catalogue's nodes + 25 %, max_catalog_fanout = its
        fan-out), on the same catalogue and prompts: --rounds interleaved rounds (order alternating), medians.
        Parity: both return the same beams (bench/harness/parity.py, 1e-5), each a catalogue item, before any figure.
  trie_update_s  a worker's CatalogStore.update from the catalogue's trie file (written offline by
        `python -m shared.catalog convert`) until the new version is current, median of --swaps;
        trie_update_from_sequences_s the same from the .npy of sequences (the trie built at the swap);
        convert_s the offline conversion.

    .venv/bin/python bench/beam_node.py --runtime-constraints [--model qwen2.5-0.5b] [--layers 2] [--items N]
        [--codebook C] [--width W] [--prompt-tokens L] [--requests R] [--rounds N] [--swaps N]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.harness import parity
from bench.harness.common import (CACHE, MODELS, Clock, bench_config, build_nodes, emit, interleaved_round, load_built,
                          median, shaped_checkpoint, these_threads)
from compile.beam import module as beam_module
from compile.beam.processors import TABLE_NAMES, PrefixConstraint, PrefixTables
from shared.catalog import CatalogBounds, build_trie, write_trie
from shared.config import BeamConfig
from worker.catalog_store import CatalogStore

S, K = 4, 4


class ConstantTablesBeam(beam_module.BeamModule):
    """The beam node with one catalogue's tables as buffers (constants of its package) and only each
    request's root as an input: the node as it was before catalogues became inputs."""

    def __init__(self, module: beam_module.BeamModule, tables: PrefixTables) -> None:
        super().__init__(module.model, module.rule, module.max_steps, module.constraint, module.pool)
        for name, table in zip(TABLE_NAMES, tables):
            self.register_buffer(f"catalog_{name}", table)

    def forward(self, prompt_ids, positions, cu_seqlens, prompt_index, prompt_valid, beam_slots, num_steps,
                early_all, catalog_root):
        tables = [getattr(self, f"catalog_{name}") for name in TABLE_NAMES]
        return super().forward(prompt_ids, positions, cu_seqlens, prompt_index, prompt_valid, beam_slots, num_steps,
                               early_all, catalog_root, *tables)


def constant_tables_builder(tables: PrefixTables):
    """A node builder (compile/build.py) for ConstantTablesBeam: beam_module.build's node, tables baked in."""
    def build(ctx):
        bounds, rule, catalog = ctx.config.bounds, ctx.beam.rule, ctx.beam.catalog
        pool = beam_module.beam_pool(bounds.max_prompt_tokens, bounds.max_beam_requests_per_batch, ctx.device)
        inner = beam_module.BeamModule(ctx.model, rule, bounds.max_new_tokens,
                                       PrefixConstraint(catalog.max_fanout, rule.eos_ids), pool)
        module = ConstantTablesBeam(inner, tables).to(ctx.device)
        inputs = beam_module.example_inputs(ctx.model.spec.vocab_size, pool.block, ctx.device, catalog)[:9]
        shapes = beam_module.dynamic_shapes(bounds.max_prompt_tokens, bounds.max_beam_requests_per_batch,
                                            bounds.max_beam_width, pool.block, True)[:9]
        with torch.no_grad():
            program = torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)
        facts = {"inputs": list(beam_module.INPUT_NAMES) + ["catalog_root"], "outputs": ["tokens", "scores", "lengths"],
                 "max_steps": bounds.max_new_tokens, "eos_ids": list(rule.eos_ids), "pad_id": rule.pad_id,
                 "length_penalty": rule.length_penalty, "early_stopping": rule.early_stopping,
                 "repetition_penalty": rule.repetition_penalty, "constrained": True, "attention_block": pool.block,
                 "max_catalog_nodes": catalog.max_nodes, "max_catalog_fanout": catalog.max_fanout}
        return module, program, facts
    return build


def synthetic_items(count: int, codebook: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """[count, 4] int64 semantic ids, -1 padded: 3 or 4 positions, position j from ids j*C+3 .. (j+1)*C+2."""
    if 4 * codebook + 3 > vocab_size:
        raise SystemExit(f"--codebook {codebook}: 4 positions of it need {4 * codebook + 3} ids, the vocabulary has "
                         f"{vocab_size}")
    rng = np.random.default_rng(seed)
    items = rng.integers(0, codebook, size=(count, 4)) + np.arange(4) * codebook + 3
    items[rng.random(count) < 0.5, 3] = -1
    return items


def is_item(trie, tokens: list[int]) -> bool:
    """`tokens` (EOS already cut) is a path from the root to a terminal node of `trie`."""
    node = 0
    for token in tokens:
        edges = range(trie.child_start[node], trie.child_start[node + 1])
        node = next((int(trie.edge_child[e]) for e in edges if trie.edge_token[e] == token), -1)
        if node < 0:
            return False
    return bool(trie.terminal[node])


def valid_check(name: str, out, trie, eos_ids) -> dict:
    """Every returned candidate is a catalogue item."""
    bad = 0
    for seq, n in zip(out.sequences.reshape(-1, S).tolist(), out.lengths.flatten().tolist()):
        body = seq[: n - 1] if n and seq[n - 1] in eos_ids else seq[:n]
        bad += not is_item(trie, body)
    return {"check": name, "candidates_not_in_catalogue": bad, "ok": bad == 0}


def timed_update(store: CatalogStore, path: Path, swaps: int) -> float:
    """Median seconds of store.update({"default": path}) until the new version is current."""
    seconds = []
    for _ in range(swaps):
        start = time.perf_counter()
        store.update({"default": path})
        seconds.append(time.perf_counter() - start)
    return median(seconds)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/beam_node.py --runtime-constraints",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2; the real depth: the model's)")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--codebook", type=int, default=256, help="ids per position of an item")
    parser.add_argument("--width", type=int, default=16, help="beams W")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2, help="prompts per call")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds")
    parser.add_argument("--swaps", type=int, default=3, help="timed catalogue swaps of each kind")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    clock = Clock()
    family, shape, _ = MODELS[args.model]
    checkpoint = shaped_checkpoint(family, shape, args.layers, torch.float32)
    vocab = shape["vocab_size"]
    folder = Path(tempfile.mkdtemp(prefix="beam-catalog-"))
    items = synthetic_items(args.items, args.codebook, vocab)
    np.save(folder / "items.npy", items)
    start = time.perf_counter()
    trie = build_trie(items, vocab, S)
    write_trie(folder / "items.npz", trie)
    convert_s = time.perf_counter() - start
    bounds = CatalogBounds(int(trie.num_nodes * 1.25), trie.fan_out)
    clock.lap("catalogue")

    config = bench_config(checkpoint, "float32", ("beam",), max_beam_width=args.width, max_new_tokens=S,
                          max_prompt_tokens=args.prompt_tokens, max_beam_requests_per_batch=max(args.requests, 2))
    config = config.replace(beam=BeamConfig(enabled=True, max_catalog_nodes=bounds.max_nodes,
                                            max_catalog_fanout=bounds.max_fanout))
    name = f"beam-catalog-{args.model}-{args.layers}l-w{args.width}"
    inputs_nodes = build_nodes(config, f"{name}-{bounds.max_nodes}n-{bounds.max_fanout}f")
    store = CatalogStore.for_manifest(inputs_nodes.manifest, "cpu")
    trie_update_s = timed_update(store, folder / "items.npz", args.swaps)
    from_sequences_s = timed_update(store, folder / "items.npy", args.swaps)
    catalog = store.current()
    tables = PrefixTables(*catalog.tables)
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in tables)).hexdigest()[:12]
    constant_folder = CACHE / "artifacts" / f"{name}-constant-{digest}"  # its tables are not in the build key
    from compile.build import build
    build(these_threads(config), constant_folder, builders={"beam": constant_tables_builder(tables)})
    constant_nodes = load_built(constant_folder, config)
    clock.lap("builds_and_swaps")

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g) for _ in range(args.requests)]
    ids, lens = torch.cat(prompts), torch.tensor([len(p) for p in prompts])
    roots = catalog.node_inputs([""] * args.requests)
    fns = {"inputs": lambda: inputs_nodes.beam(ids, lens, args.width, S, K, catalog=roots),
           "constant": lambda: constant_nodes.beam(ids, lens, args.width, S, K, catalog=roots[:1])}
    first = interleaved_round(fns)  # warm-up, and the outputs parity is checked on
    eos = inputs_nodes.manifest.node_table().beam.eos_ids
    (_, ours), (_, theirs) = first["inputs"], first["constant"]
    found = [parity.beams_check("inputs vs constant tables", ours.sequences, ours.scores, ours.lengths,
                                theirs.sequences, theirs.scores, 1e-5),
             valid_check("inputs: candidates are items", ours, trie, eos),
             valid_check("constant: candidates are items", theirs, trie, eos)]
    seconds = {n: [] for n in fns}
    for r in range(args.rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for n, (s, _) in interleaved_round({n: fns[n] for n in order}).items():
            seconds[n].append(s)
    clock.lap("timed_rounds")
    inputs_s, constant_s = median(seconds["inputs"]), median(seconds["constant"])
    result = {
        "bench": "beam_node_runtime_constraints", "model": args.model, "layers": args.layers,
        "speedup_vs_constant_tables": constant_s / inputs_s, "trie_update_s": trie_update_s,
        "trie_update_from_sequences_s": from_sequences_s, "convert_s": convert_s,
        "goals": {"speedup_vs_constant_tables": ">= 0.95", "trie_update_s": "<= 2.0"},
        "parity_ok": parity.all_ok(found), "parity": found,
        "quick": args.layers != MODELS[args.model][2] or args.items < 1_000_000,
        "items": args.items, "catalogue": {"items": trie.num_items, "nodes": trie.num_nodes, "fan_out": trie.fan_out,
                                           "codebook": args.codebook, "lengths": [3, 4]},
        "max_catalog_nodes": bounds.max_nodes, "max_catalog_fanout": bounds.max_fanout,
        "W": args.width, "S": S, "k": K, "requests_per_call": args.requests, "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds, "swaps": args.swaps,
        "ms_per_call": {"inputs": 1e3 * inputs_s, "constant": 1e3 * constant_s},
        "ms_per_call_all": {n: [round(1e3 * s, 2) for s in v] for n, v in seconds.items()},
        "phase_seconds": clock.laps,
    }
    emit(f"beam_node-runtime-constraints-{args.model}-{args.layers}l-{args.items}items", result)
