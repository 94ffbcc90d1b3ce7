"""Handlers of the `python -m loadgen` subcommands: read arguments, wire the parts, print results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.importers import ImportOptions, import_trace
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.retry import RetryOptions
from loadgen.simulator import SimSettings, simulate
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import Trace, read_trace, write_trace
from loadgen.tuner import TUNABLE, check_knobs
from shared.config import DeploymentConfig, load_config

OFFLINE_HEADROOM = 0.85
"""Offline, a candidate's simulated percentile must stay within this x the SLO (the simulator's target
error against live, as `loadgen validate` measures it)."""


def cmd_synth(args: argparse.Namespace) -> int:
    spec = SynthSpec(
        arrivals=args.arrivals, rate_rps=args.rate, duration_s=args.duration_s, cv=args.cv,
        burst_size=args.burst_size, burst_spread_ms=args.burst_spread_ms, score_fraction=args.score_fraction,
        samples=args.samples, samples_cv=args.samples_cv, tokens_per_sample=args.tokens_per_sample,
        tokens_cv=args.tokens_cv, prompt_tokens=args.prompt_tokens, prompt_cv=args.prompt_cv,
        max_samples=args.max_samples, max_tokens_per_sample=args.max_tokens_per_sample,
        max_prompt_tokens=args.max_prompt_tokens,
        beam_width=args.beam_width, max_new_tokens=args.max_new_tokens, deadline_ms=args.deadline_ms,
        seed=args.seed,
    )
    trace = synthesize(spec)
    write_trace(trace, args.out)
    print(f"wrote {len(trace.records)} requests ({trace.rate_rps():.1f}/s over {trace.duration_ms() / 1000:.1f} s) "
          f"to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    options = ImportOptions(
        route=args.route, score_fraction=args.score_fraction, samples_per_request=args.samples_per_request,
        max_tokens_per_sample=args.max_tokens_per_sample, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, beam_width=args.beam_width, limit=args.limit, seed=args.seed,
    )
    trace = import_trace(args.input, args.format, options)
    write_trace(trace, args.out)
    meta = trace.meta
    print(f"imported {meta['rows']} rows from {args.input} ({args.format}; columns used: "
          f"{', '.join(meta['columns_used'])}) into {args.out}")
    if meta["clipped_rows"]:
        print(f"note: {meta['clipped_rows']} rows had more input tokens than the bounds allow and were "
              f"clipped (max_tokens_per_sample={args.max_tokens_per_sample}, "
              f"max_prompt_tokens={args.max_prompt_tokens})", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from loadgen.report import build_report, write_report

    trace = read_trace(args.trace)
    options = _replay_options(args, speed=args.speed, duration_s=args.duration_s)
    run = run_replay(trace, _bodies(args), options)
    meta = {"trace": args.trace, "url": args.url, "slo_ms": args.slo_ms, "speed": args.speed, "duration_s": args.duration_s,
            "body_mode": args.body_mode, "trace_meta": trace.meta}
    report = build_report(run, args.slo_ms, meta, args.bin_s)
    page = write_report(args.out_dir, run, report, plots=not args.no_plots)
    _print_summary(report)
    print(f"report: {page}  (numbers: {Path(args.out_dir) / 'report.json'})")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from loadgen import plots
    from loadgen.sweep import sweep, sweep_table

    trace = read_trace(args.trace)
    evaluate = _trace_evaluator(args)
    result = sweep(trace, args.rates, evaluate, args.slo_ms, args.pct, args.refine,
                   on_row=lambda row: print(f"  rate {row['target_rps']:.1f}/s: attainment "
                                            f"{row['attainment']:.3f}", file=sys.stderr))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({"rows": result.rows, "best_rps": result.best_rps,
                                                "slo_ms": args.slo_ms, "pct": args.pct}, indent=2))
    (out / "goodput_vs_offered.png").write_bytes(plots.goodput_vs_offered(result.rows, args.slo_ms, args.pct))
    print(sweep_table(result))
    best = "none of the rates" if result.best_rps is None else f"{result.best_rps:.1f} requests/s"
    print(f"highest rate with {args.pct:g} % of requests answered within {args.slo_ms:g} ms: {best}")
    print(f"wrote {out / 'sweep.json'} and {out / 'goodput_vs_offered.png'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from loadgen.tuner import config_snippet, grid, table, tune

    trace = read_trace(args.trace)
    base = load_config(args.config) if args.config else DeploymentConfig()
    axes = parse_grid(args.grid) or default_grid(trace, args.slo_ms, base.gateway.max_deadline_ms)
    candidates = grid(axes)
    check_grid(base, axes, candidates)
    print(f"tuning {len(candidates)} candidates ({'simulated' if args.offline else 'live'})", file=sys.stderr)
    evaluate = _candidate_evaluator(args, trace)
    headroom = args.headroom if args.headroom is not None else (OFFLINE_HEADROOM if args.offline else 1.0)
    if not 0 < headroom <= 1:
        raise ValueError(f"--headroom {headroom} must be in (0, 1]")
    result = tune(candidates, evaluate, args.slo_ms, args.pct, headroom=headroom,
                  on_result=lambda c: print(f"  {c.knobs}: goodput {c.goodput_rps:.1f}/s", file=sys.stderr))
    print(table(result))
    best = result.best_candidate()
    report: dict[str, Any] = {"candidates": [c.row() for c in result.candidates], "slo_ms": args.slo_ms,
                              "pct": args.pct, "headroom": headroom, "best": None if best is None else best.knobs}
    if best is None:
        print(f"\nno candidate kept p{args.pct:g} within {headroom:g} x {args.slo_ms:g} ms; widen the grid or add "
              "workers")
    else:
        print(f"\nrecommended (goodput {best.goodput_rps:.1f}/s, p{args.pct:g} {best.latency_pct_ms:.1f} ms):\n")
        print(config_snippet(best.knobs))
        if args.write_config:
            _write_config(args, best.knobs)
    if args.capacity:
        report["capacity"] = _capacity(args, trace, best.knobs if best else {})
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0


def _write_config(args: argparse.Namespace, knobs: dict[str, Any]) -> None:
    from loadgen.tuner import recommended_config

    if not args.config:
        raise ValueError("--write-config needs --config (the deployment the settings are applied to)")
    Path(args.write_config).write_text(recommended_config(args.config, knobs))
    print(f"wrote {args.write_config} ({args.config} with the recommended settings)")


def cmd_validate(args: argparse.Namespace) -> int:
    from loadgen.validate import ValidateOptions, validate

    options = ValidateOptions(
        trace_path=args.trace, config_path=args.config, artifacts=args.artifacts,
        levels=tuple(args.levels), duration_s=args.duration_s, slo_ms=args.slo_ms,
        calibration_requests=args.calibration_requests, label_token_ids=tuple(args.label_token_ids),
    )
    summary = validate(options, args.out_dir)
    for row in summary["levels"]:
        print(f"load {row['load']:g}: goodput live {row['live_goodput_rps']:.1f}/s sim {row['sim_goodput_rps']:.1f}/s, "
              f"p99 live {row['live_p99_ms']} ms sim {row['sim_p99_ms']} ms", file=sys.stderr)
    print(f"report: {Path(args.out_dir) / 'index.html'}", file=sys.stderr)
    print(json.dumps(_short(summary)))
    return 0


def _short(summary: dict[str, Any]) -> dict[str, Any]:
    """The last line of `validate`: the levels' headline figures and the largest relative error."""
    from loadgen.report import clean_json

    keys = ("load", "offered_rps", "live_goodput_rps", "sim_goodput_rps", "live_p99_ms", "sim_p99_ms",
            "goodput_rel_err", "p99_rel_err")
    levels = [{k: row[k] for k in keys} for row in summary["levels"]]
    return clean_json({"levels": levels, "max_rel_err": summary["max_rel_err"],
                       "capacity_rps": summary["capacity_rps"], "slo_ms": summary["slo_ms"]})


def cmd_bound(args: argparse.Namespace) -> int:
    from loadgen.bound import bound_by_load

    trace, settings = read_trace(args.trace), base_settings(args)
    loads = bound_by_load(trace, settings, _service(args), args.loads, args.base_rps)
    print(json.dumps({"bound": "clairvoyant", "trace": args.trace, "requests": len(trace.records),
                      "workers": settings.workers, "base_rps": args.base_rps or round(trace.rate_rps(), 3),
                      "loads": loads}))
    return 0


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """--grid NAME=v1,v2,... items as axes; each value typed as TOML types it (see grid_value). Their
    ranges are checked against the base config by check_grid."""
    axes = {}
    for item in items:
        name, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not all(parts):
            raise ValueError(f"--grid {item!r}: expected NAME=v1,v2,...")
        if name not in TUNABLE:
            raise ValueError(f"--grid {name!r} is not a setting; known: {', '.join(TUNABLE)}")
        axes[name] = [grid_value(v) for v in parts]
    return axes


def grid_value(text: str) -> int | float | bool | str:
    """A --grid value as TOML types it: an integer, a number, true or false; else the word itself (a
    choice such as queue_order's), which the setting's own rules accept or refuse."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def check_grid(base: DeploymentConfig, axes: dict[str, list[Any]], candidates: list[dict[str, Any]]) -> None:
    """Refuse, before anything runs, a grid value or candidate that the deployment config's rules (or,
    for the simulated world's knobs, their ranges) refuse, on `base` (the --config, or the defaults)."""
    for name, values in axes.items():
        for value in values:
            check_knobs({name: value}, base, f"--grid {name}={value}")
    for knobs in candidates:
        check_knobs(knobs, base, "--grid candidate " + ", ".join(f"{k}={v}" for k, v in knobs.items()))


def default_grid(trace: Trace, slo_ms: float, max_deadline_ms: int) -> dict[str, list[float]]:
    """Batch wait, margin and the default deadline of each route the trace uses, around the SLO (at most the
    longest deadline the base config lets a request have)."""
    routes = {r.route for r in trace.records if r.deadline_ms is None}
    axes: dict[str, list[float]] = {"max_batch_wait_ms": [0.0, 1.0, 2.0, 5.0], "admission_margin_ms": [0.0, 1.0, 3.0]}
    for route in sorted(routes):
        axes[f"{route}_deadline_ms"] = sorted({min(max_deadline_ms, max(1, round(slo_ms * f)))
                                               for f in (0.5, 0.75, 1.0)})
    return axes


def base_settings(args: argparse.Namespace) -> SimSettings:
    world = {"default_beam_width": args.beam_width, "request_overhead_ms": args.overhead_ms,
             "batch_overhead_ms": args.batch_overhead_ms, "static_prefix_tokens": args.static_prefix_tokens}
    if args.config:
        settings = SimSettings.from_config(load_config(args.config), **world)
    else:
        settings = SimSettings(**world)
    return settings if args.workers is None else settings.with_knobs({"workers": args.workers})


def _service(args: argparse.Namespace):
    from loadgen.service import load_service_model

    if not args.latency_model:
        raise ValueError("--offline needs --latency-model (the workers' fitted model, JSON or a,b,g,d)")
    return load_service_model(args.latency_model)


def _trace_evaluator(args: argparse.Namespace):
    if args.offline:
        service, settings = _service(args), base_settings(args)
        return lambda trace: simulate(trace, settings, service)
    bodies, options = _bodies(args), _replay_options(args, duration_s=args.step_duration_s)
    return lambda trace: run_replay(trace, bodies, options).results


def _candidate_evaluator(args: argparse.Namespace, trace: Trace):
    if args.offline:
        service, settings = _service(args), base_settings(args)
        return lambda knobs: simulate(trace, settings.with_knobs(knobs), service)
    from loadgen.live import LiveEvaluator, LiveOptions

    if not args.gateway_cmd:
        raise ValueError("live tuning needs --gateway-cmd (or pass --offline with --latency-model)")
    live = LiveOptions(command_template=args.gateway_cmd, base_config=args.config, url=args.url,
                       startup_timeout_s=args.startup_timeout_s, warmup_s=args.warmup_s)
    window = trace.window(0.0, args.window_s * 1000.0)
    return LiveEvaluator(window, _bodies(args), live, _replay_options(args))


def _capacity(args: argparse.Namespace, trace: Trace, knobs: dict[str, Any]) -> dict[str, Any]:
    from loadgen.capacity import capacity_report

    settings = base_settings(args).with_knobs({k: v for k, v in knobs.items() if k != "workers"})
    cap = capacity_report(trace, _service(args), settings, args.slo_ms, args.pct, args.max_workers)
    print(f"\ncapacity for p{args.pct:g} <= {args.slo_ms:g} ms at {cap['rate_rps']:.1f} requests/s "
          f"(c_a {cap['ca']:.2f}, tau {cap['tau_ms']:.2f} ms, c_s {cap['cs']:.2f}):")
    def workers(count: int | None) -> str:  # None: no count up to --max-workers met the SLO
        return f"{count} workers" if count is not None else f"more than {args.max_workers} workers (--max-workers)"

    print(f"  Kingman (unbatched):   {workers(cap['kingman_workers'])} ({cap['desired_workers']:.2f} fractional: what "
          "a gateway sent this traffic exports as boundserve_desired_workers)")
    print(f"  simulated, unbatched:  {workers(cap['simulated_unbatched_workers'])}")
    print(f"  simulated, recommended settings with batching: {workers(cap['simulated_batched_workers'])}")
    return cap


def _bodies(args: argparse.Namespace) -> BodyFactory:
    return BodyFactory(BodyOptions(
        mode=args.body_mode, tokenizer_path=args.tokenizer, label_token_ids=tuple(args.label_token_ids),
        output=args.output, top_k=args.top_k, beam_width=args.beam_width, max_new_tokens=args.max_new_tokens,
        num_return_sequences=args.num_return_sequences, deadline_ms=args.deadline_ms,
    ))


def _replay_options(args: argparse.Namespace, speed: float = 1.0, duration_s: float | None = None) -> ReplayOptions:
    headers = []
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--header {item!r}: expected 'Name: value'")
        headers.append((name.strip(), value.strip()))
    return ReplayOptions(url=args.url, speed=speed, duration_s=duration_s, timeout_s=args.timeout_s,
                         progress=not args.no_progress, headers=tuple(headers),
                         replicas=tuple(getattr(args, "replica", ())), retry=_retry(args))


def _retry(args: argparse.Namespace) -> RetryOptions | None:
    """`replay --retry`'s options (None without it); a retry needs somewhere else to go."""
    share = getattr(args, "retry_try_share", None)
    if not getattr(args, "retry", False):
        if share is not None:
            raise ValueError("--retry-try-share is a setting of --retry: add --retry")
        return None
    if not args.replica:
        raise ValueError("--retry needs --replica URL: a retry goes to another gateway of the deployment")
    if share is not None and not share < 1.0:
        raise ValueError(f"--retry-try-share must be below 1 (a share of the deadline); got {share:g}")
    return RetryOptions(first_try_timeout_share=share)


def _print_summary(report: dict[str, Any]) -> None:
    for route, s in report["routes"].items():
        lat = s["latency_ms"]
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"{route:>9}: sent {s['sent']}, ok {s['ok']}, {fmt(s['throughput_rps'])}/s, goodput "
              f"{fmt(s['goodput_rps'])}/s, p50 {fmt(lat['p50'])} p99 {fmt(lat['p99'])} p99.9 {fmt(lat['p999'])} "
              f"ms, outcomes {s['outcomes']}")
    sender = report["sender"]
    if sender["saturated"]:
        print(f"WARNING: the client fell behind its schedule (p99 lag {sender['lag_ms']['p99']:.1f} ms); "
              "latencies include client delay", file=sys.stderr)
