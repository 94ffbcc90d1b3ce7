"""Command-line parser of `python -m loadgen`; the handlers live in loadgen/commands.py."""

from __future__ import annotations

import argparse

from loadgen.importers import FORMATS
from loadgen.synth import ARRIVALS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _synth(sub.add_parser("synth", help="write a synthetic trace (Poisson, Gamma, bursts)"))
    _import(sub.add_parser("import", help="convert a public trace (Azure, BurstGPT, Mooncake)"))
    _replay(sub.add_parser("replay", help="open-loop replay against a live gateway, with a report"))
    _sweep(sub.add_parser("sweep", help="offered-load sweep: highest rate meeting the SLO"))
    _tune(sub.add_parser("tune", help="search gateway settings for the best goodput within the SLO"))
    _validate(sub.add_parser("validate", help="replay a trace live and simulated on a local stack; compare"))
    return parser


def _synth(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="trace file to write (JSON lines)")
    p.add_argument("--arrivals", choices=ARRIVALS, default="poisson")
    p.add_argument("--rate", type=float, default=50.0, help="mean requests per second")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--cv", type=float, default=1.0, help="gamma: inter-arrival coefficient of variation")
    p.add_argument("--burst-size", type=int, default=8, help="bursts: requests per upstream query")
    p.add_argument("--burst-spread-ms", type=float, default=1.0)
    p.add_argument("--score-fraction", type=float, default=1.0, help="share of score requests (rest generate)")
    p.add_argument("--samples", type=int, default=15, help="score: mean samples per request")
    p.add_argument("--samples-cv", type=float, default=0.0)
    p.add_argument("--tokens-per-sample", type=int, default=100)
    p.add_argument("--tokens-cv", type=float, default=0.0)
    p.add_argument("--prompt-tokens", type=int, default=64, help="generate: mean prompt tokens")
    p.add_argument("--prompt-cv", type=float, default=0.0)
    p.add_argument("--beam-width", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--deadline-ms", type=float, default=None, help="per-request deadline (default: none)")
    p.add_argument("--seed", type=int, default=0)


def _import(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="the public trace file")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--out", required=True)
    p.add_argument("--route", choices=("score", "generate", "mix"), default="score")
    p.add_argument("--score-fraction", type=float, default=0.5, help="mix: share of score requests")
    p.add_argument("--samples-per-request", type=int, default=15)
    p.add_argument("--max-tokens-per-sample", type=int, default=512)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--beam-width", type=int, default=None)
    p.add_argument("--limit", type=int, default=None, help="keep the first N rows (by time)")
    p.add_argument("--seed", type=int, default=0)


def _target(p: argparse.ArgumentParser) -> None:
    """Where and what to send (live modes)."""
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--body-mode", choices=("ids", "text"), default="ids",
                   help="ids: exact {'input_ids': [...]} inputs (default); text: needs --tokenizer")
    p.add_argument("--tokenizer", default=None, help="the served tokenizer.json (artifacts folder)")
    p.add_argument("--label-token-ids", default="10,11", help="score: comma-separated label token ids")
    p.add_argument("--output", default="logprobs", choices=("probs", "logprobs", "logits", "topk", "embedding"))
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--beam-width", type=int, default=16, help="generate: default when the trace has none")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--num-return-sequences", type=int, default=1)
    p.add_argument("--deadline-ms", type=float, default=None,
                   help="deadline for requests without one (default: the gateway's route default)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="client timeout per request")
    p.add_argument("--header", action="append", default=[], help="extra HTTP header 'Name: value'")
    p.add_argument("--no-progress", action="store_true")


def _slo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--slo-ms", type=float, required=True)
    p.add_argument("--pct", type=float, default=99.0, help="latency percentile the SLO bounds")


def _offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="simulate instead of sending requests")
    p.add_argument("--latency-model", default=None,
                   help="offline: JSON file/inline {score:{alpha,beta,gamma,delta}, beam:{...}} or a,b,g,d")
    p.add_argument("--config", default=None, help="deployment TOML: base [gateway] settings and [bounds]")
    p.add_argument("--workers", type=int, default=None, help="offline: worker count (default: the config's)")
    p.add_argument("--overhead-ms", type=float, default=0.0,
                   help="offline: fixed per-request time outside the gateway's queue and the workers (HTTP, "
                        "tokenizing); `loadgen validate` measures it")
    p.add_argument("--batch-overhead-ms", type=float, default=0.0,
                   help="offline: fixed time per batch around the compute (messages, packing); validate measures it")
    p.add_argument("--static-prefix-tokens", type=int, default=0,
                   help="offline: tokens of the score node's static prefix (its manifest's nodes.score."
                        "static_prefix_ids); each sample at least as long reuses them, as on the gateway")


def _replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--slo-ms", type=float, default=None)
    p.add_argument("--speed", type=float, default=1.0, help="time scale (2 = twice as fast)")
    p.add_argument("--duration-s", type=float, default=None, help="replay only the first S seconds")
    p.add_argument("--out-dir", default="loadgen-report")
    p.add_argument("--bin-s", type=float, default=1.0, help="time-series bin width")
    p.add_argument("--no-plots", action="store_true")
    _target(p)


def _sweep(p: argparse.ArgumentParser) -> None:
    _slo(p)
    p.add_argument("--rates", required=True, help="comma-separated target rates (requests/s)")
    p.add_argument("--refine", type=int, default=0, help="bisection steps at the pass/fail boundary")
    p.add_argument("--step-duration-s", type=float, default=None, help="live: seconds of trace per rate")
    p.add_argument("--out-dir", default="loadgen-sweep")
    _offline(p)
    _target(p)


def _tune(p: argparse.ArgumentParser) -> None:
    _slo(p)
    p.add_argument("--grid", action="append", default=[],
                   help="NAME=v1,v2,... (repeatable): max_batch_wait_ms, max_queue_tokens, admission_margin_ms, "
                        "score_deadline_ms, generate_deadline_ms (offline also workers and any [bounds] key, e.g. "
                        "max_tokens_per_batch, max_samples_per_batch, max_beam_requests_per_batch)")
    p.add_argument("--headroom", type=float, default=None,
                   help="a candidate meets the SLO when its percentile is within headroom x SLO (default: 0.85 "
                        "offline, room for the simulator's error as loadgen validate measures it; 1 live)")
    p.add_argument("--capacity", action="store_true", help="also estimate the workers needed (offline)")
    p.add_argument("--max-workers", type=int, default=32)
    p.add_argument("--gateway-cmd", default=None,
                   help="live: command starting a gateway; {config} = candidate TOML, {port} = port")
    p.add_argument("--window-s", type=float, default=10.0, help="live: seconds of trace per candidate")
    p.add_argument("--startup-timeout-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=1.0, help="live: seconds of trace sent and discarded first")
    p.add_argument("--out", default=None, help="write the table and recommendation as JSON here")
    p.add_argument("--write-config", default=None,
                   help="write the recommended deployment config here (TOML: --config with the settings applied)")
    _offline(p)
    _target(p)


def _validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--config", required=True, help="deployment TOML of the stack to start")
    p.add_argument("--artifacts", required=True, help="compiled artifacts folder (python -m compile)")
    p.add_argument("--levels", default="0.5,1,2", help="load levels as fractions of capacity, comma-separated")
    p.add_argument("--duration-s", type=float, default=20.0, help="seconds of trace replayed per level")
    p.add_argument("--slo-ms", type=float, default=None,
                   help="goodput counts successes within this (default: the config's deadline for the route)")
    p.add_argument("--calibration-requests", type=int, default=300)
    p.add_argument("--label-token-ids", default="10,11", help="score: comma-separated label token ids")
    p.add_argument("--out-dir", default="loadgen-validate")
