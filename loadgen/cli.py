"""Command-line parser of `python -m loadgen`; the handlers live in loadgen/commands.py."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

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
    _bound(sub.add_parser("bound", help="clairvoyant upper bound on goodput per load and class (offline)"))
    return parser


def _synth(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=out_file, help="trace file to write (JSON lines)")
    p.add_argument("--arrivals", choices=ARRIVALS, default="poisson")
    p.add_argument("--rate", type=positive_float, default=50.0, help="mean requests per second")
    p.add_argument("--duration-s", type=positive_float, default=10.0)
    p.add_argument("--cv", type=positive_float, default=1.0, help="gamma: inter-arrival coefficient of variation")
    p.add_argument("--burst-size", type=positive_int, default=8, help="bursts: requests per upstream query")
    p.add_argument("--burst-spread-ms", type=non_negative_float, default=1.0)
    p.add_argument("--score-fraction", type=fraction, default=1.0, help="share of score requests (rest generate)")
    p.add_argument("--samples", type=positive_int, default=15, help="score: mean samples per request")
    p.add_argument("--samples-cv", type=non_negative_float, default=0.0)
    p.add_argument("--max-samples", type=positive_int, default=64, help="score: most samples a request draws")
    p.add_argument("--tokens-per-sample", type=positive_int, default=100)
    p.add_argument("--tokens-cv", type=non_negative_float, default=0.0)
    p.add_argument("--max-tokens-per-sample", type=positive_int, default=512, help="score: longest sample drawn")
    p.add_argument("--prompt-tokens", type=positive_int, default=64, help="generate: mean prompt tokens")
    p.add_argument("--prompt-cv", type=non_negative_float, default=0.0)
    p.add_argument("--max-prompt-tokens", type=positive_int, default=512, help="generate: longest prompt drawn")
    p.add_argument("--beam-width", type=positive_int, default=16)
    p.add_argument("--max-new-tokens", type=positive_int, default=4)
    p.add_argument("--deadline-ms", type=deadline, default=None, help="per-request deadline (default: none)")
    p.add_argument("--seed", type=non_negative_int, default=0)


def _import(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="the public trace file")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--out", required=True, type=out_file)
    p.add_argument("--route", choices=("score", "generate", "mix"), default="score")
    p.add_argument("--score-fraction", type=fraction, default=0.5, help="mix: share of score requests")
    p.add_argument("--samples-per-request", type=positive_int, default=15)
    p.add_argument("--max-tokens-per-sample", type=positive_int, default=512)
    p.add_argument("--max-prompt-tokens", type=positive_int, default=512)
    p.add_argument("--max-new-tokens", type=positive_int, default=4)
    p.add_argument("--beam-width", type=positive_int, default=None)
    p.add_argument("--limit", type=positive_int, default=None, help="keep the first N rows (by time)")
    p.add_argument("--seed", type=int, default=0)


def _target(p: argparse.ArgumentParser) -> None:
    """Where and what to send (live modes)."""
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--body-mode", choices=("ids", "text"), default="ids",
                   help="ids: exact {'input_ids': [...]} inputs (default); text: needs --tokenizer")
    p.add_argument("--tokenizer", default=None, help="the served tokenizer.json (artifacts folder)")
    p.add_argument("--label-token-ids", type=token_ids, default="10,11",
                   help="score: comma-separated label token ids")
    p.add_argument("--output", default="logprobs", choices=("probs", "logprobs", "logits", "topk", "embedding"))
    p.add_argument("--top-k", type=positive_int, default=None)
    p.add_argument("--beam-width", type=positive_int, default=16, help="generate: default when the trace has none")
    p.add_argument("--max-new-tokens", type=positive_int, default=4)
    p.add_argument("--num-return-sequences", type=positive_int, default=1)
    p.add_argument("--deadline-ms", type=deadline, default=None,
                   help="deadline for requests without one (default: the gateway's route default)")
    p.add_argument("--timeout-s", type=positive_float, default=30.0, help="client timeout per request")
    p.add_argument("--header", action="append", default=[], help="extra HTTP header 'Name: value'")
    p.add_argument("--no-progress", action="store_true")


def _slo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--slo-ms", type=positive_float, required=True)
    p.add_argument("--pct", type=percent, default=99.0, help="latency percentile the SLO bounds")


def _offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="simulate instead of sending requests")
    p.add_argument("--latency-model", default=None,
                   help="offline: JSON file/inline {score:{alpha,beta,gamma,delta}, beam:{...}} or a,b,g,d")
    p.add_argument("--config", default=None, help="deployment TOML: base [gateway] settings and [bounds]")
    p.add_argument("--workers", type=positive_int, default=None, help="offline: worker count (default: the config's)")
    p.add_argument("--overhead-ms", type=non_negative_float, default=0.0,
                   help="offline: fixed per-request time outside the gateway's queue and the workers (HTTP, "
                        "tokenizing); `loadgen validate` measures it")
    p.add_argument("--batch-overhead-ms", type=non_negative_float, default=0.0,
                   help="offline: fixed time per batch around the compute (messages, packing); validate measures it")
    p.add_argument("--static-prefix-tokens", type=non_negative_int, default=0,
                   help="offline: tokens of the score node's static prefix (its manifest's nodes.score."
                        "static_prefix_ids); each sample at least as long reuses them, as on the gateway")


def _replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--slo-ms", type=positive_float, default=None)
    p.add_argument("--speed", type=positive_float, default=1.0, help="time scale (2 = twice as fast)")
    p.add_argument("--duration-s", type=positive_float, default=None, help="replay only the first S seconds")
    p.add_argument("--out-dir", type=out_dir, default="loadgen-report")
    p.add_argument("--bin-s", type=positive_float, default=1.0, help="time-series bin width")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--replica", action="append", default=[], metavar="URL",
                   help="another gateway of the same deployment (repeatable): requests are spread round-robin "
                        "over --url and these")
    p.add_argument("--retry", action="store_true", help="retry a refused (429, 503), 504 or timed-out request once "
                   "on the next replica within what is left of its deadline, honouring Retry-After")
    p.add_argument("--retry-try-share", type=positive_float, default=None,
                   help="with --retry: give a first try up after this share (< 1) of its deadline and retry it")
    _target(p)


def _sweep(p: argparse.ArgumentParser) -> None:
    _slo(p)
    p.add_argument("--rates", required=True, type=positive_numbers, help="comma-separated target rates (requests/s)")
    p.add_argument("--refine", type=non_negative_int, default=0, help="bisection steps at the pass/fail boundary")
    p.add_argument("--step-duration-s", type=positive_float, default=None, help="live: seconds of trace per rate")
    p.add_argument("--out-dir", type=out_dir, default="loadgen-sweep")
    _offline(p)
    _target(p)


def _tune(p: argparse.ArgumentParser) -> None:
    _slo(p)
    p.add_argument("--grid", action="append", default=[],
                   help="NAME=v1,v2,... (repeatable; values as TOML types them, checked by the config's rules "
                        "before anything runs): max_batch_wait_ms, max_queue_tokens, admission_margin_ms, "
                        "score_deadline_ms, generate_deadline_ms (offline also workers and any [bounds] key, e.g. "
                        "max_tokens_per_batch, max_samples_per_batch, max_beam_requests_per_batch)")
    p.add_argument("--headroom", type=float, default=None,
                   help="a candidate meets the SLO when its percentile is within headroom x SLO (default: 0.85 "
                        "offline, room for the simulator's error as loadgen validate measures it; 1 live)")
    p.add_argument("--capacity", action="store_true", help="also estimate the workers needed (offline)")
    p.add_argument("--max-workers", type=positive_int, default=32)
    p.add_argument("--gateway-cmd", default=None,
                   help="live: command starting a gateway; {config} = candidate TOML, {port} = port")
    p.add_argument("--window-s", type=positive_float, default=10.0, help="live: seconds of trace per candidate")
    p.add_argument("--startup-timeout-s", type=positive_float, default=60.0)
    p.add_argument("--warmup-s", type=non_negative_float, default=1.0,
                   help="live: seconds of trace sent and discarded first")
    p.add_argument("--out", type=out_file, default=None, help="write the table and recommendation as JSON here")
    p.add_argument("--write-config", type=out_file, default=None,
                   help="write the recommended deployment config here (TOML: --config with the settings applied)")
    _offline(p)
    _target(p)


def _validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--config", required=True, help="deployment TOML of the stack to start")
    p.add_argument("--artifacts", required=True, help="compiled artifacts folder (python -m compile)")
    p.add_argument("--levels", type=positive_numbers, default="0.5,1,2",
                   help="load levels as fractions of capacity, comma-separated")
    p.add_argument("--duration-s", type=positive_float, default=20.0, help="seconds of trace replayed per level")
    p.add_argument("--slo-ms", type=positive_float, default=None,
                   help="goodput counts successes within this (default: the config's deadline for the route)")
    p.add_argument("--calibration-requests", type=positive_int, default=300)
    p.add_argument("--label-token-ids", type=token_ids, default="10,11",
                   help="score: comma-separated label token ids")
    p.add_argument("--out-dir", type=out_dir, default="loadgen-validate")


def _bound(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True)
    p.add_argument("--latency-model", required=True,
                   help="JSON file/inline {score:{alpha,beta,gamma,delta}, beam:{...}} or a,b,g,d")
    p.add_argument("--config", default=None, help="deployment TOML: its [bounds], deadlines and workers")
    p.add_argument("--workers", type=positive_int, default=None, help="worker count (default: the config's)")
    p.add_argument("--loads", type=positive_numbers, default="1,2,4",
                   help="load multipliers, comma-separated: the trace's send times divided by each")
    p.add_argument("--base-rps", type=positive_float, default=None,
                   help="the mean rate that load 1 means (default: the trace's own)")
    p.add_argument("--beam-width", type=positive_int, default=16, help="generate: default when the trace has none")
    p.add_argument("--static-prefix-tokens", type=non_negative_int, default=0,
                   help="tokens of the score node's static prefix, reused by each sample at least as long")
    p.set_defaults(overhead_ms=0.0, batch_overhead_ms=0.0)


# -- argument types: argparse calls them on the text given, and an ArgumentTypeError becomes a usage
# error naming the option (exit status 2), before any work starts.

def _checked(convert: Callable[[str], float], what: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: `convert` the text and keep it when `accept`s it, else say it must be `what`."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return parse


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


positive_int = _checked(int, "an integer >= 1", lambda v: v >= 1)
non_negative_int = _checked(int, "an integer >= 0", lambda v: v >= 0)
positive_float = _checked(_finite, "a number > 0", lambda v: v > 0)
non_negative_float = _checked(_finite, "a number >= 0", lambda v: v >= 0)
fraction = _checked(_finite, "a number between 0 and 1", lambda v: 0 <= v <= 1)
percent = _checked(_finite, "a percentage above 0 and at most 100", lambda v: 0 < v <= 100)
deadline = _checked(_finite, "a number of milliseconds >= 1 (the gateway's shortest deadline)", lambda v: v >= 1)


def _comma_list(item: Callable[[str], float], what: str) -> Callable[[str], list]:
    """An argparse type for a non-empty comma-separated list, each item parsed by `item`."""
    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",")]
        if not text.strip() or not all(parts):
            raise argparse.ArgumentTypeError(f"must be comma-separated {what}, got {text!r}")
        values = []
        for part in parts:
            try:
                values.append(item(part))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"must be comma-separated {what}; {part!r} in {text!r} is "
                                                 "not one") from None
        return values
    return parse


positive_numbers = _comma_list(positive_float, "numbers > 0")
token_ids = _comma_list(non_negative_int, "token ids (integers >= 0)")


def out_file(text: str) -> str:
    """A file to write: not a folder, in a folder that exists (checked before the work that fills it)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; expected a file to write")
    if not path.parent.is_dir():
        problem = "is not a folder" if path.parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {path.parent} {problem}")
    return text


def out_dir(text: str) -> str:
    """A folder to write into, created if missing: its nearest existing ancestor (or itself) must be a folder."""
    path = Path(text)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {existing} is a file, not a folder")
    return text
