"""Prometheus text-format metrics: counters, per-stage latency histograms and gauges, no dependency.

Exposed on GET /metrics: requests by route and outcome, latency per stage (admission, tokenize,
queue, worker, total), queue depth, batch fill, workers ready, drops by reason, and the prompt
tokens of answered scoring requests with those the workers reused instead of computing (shared
prefixes, the static prefix).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
STAGES = ("admission", "tokenize", "queue", "worker", "total")


class Histogram:
    """Cumulative-bucket histogram of one labelled series."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip((*self.buckets, "+Inf"), self.counts):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.total:.6g}")
        out.append(f"{name}_count{{{labels}}} {running}")
        return out


class Metrics:
    """All gateway metrics; `render()` gives the Prometheus text exposition."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = defaultdict(int)
        self.drops: dict[str, int] = defaultdict(int)
        self.stage_ms = {stage: Histogram(LATENCY_BUCKETS_MS) for stage in STAGES}
        self.batch_fill: dict[str, Histogram] = defaultdict(lambda: Histogram(FILL_BUCKETS))
        self.batches: dict[str, int] = defaultdict(int)
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.score_tokens = {"prompt": 0, "cached": 0}
        self.shared_requests = {"true": 0, "false": 0}

    def count_request(self, route: str, outcome: str) -> None:
        self.requests[(route, outcome)] += 1

    def count_drop(self, reason: str) -> None:
        self.drops[reason] += 1

    def observe_stage(self, stage: str, ms: float) -> None:
        self.stage_ms[stage].observe(ms)

    def observe_batch(self, workload: str, fill: float) -> None:
        self.batches[workload] += 1
        self.batch_fill[workload].observe(fill)

    def count_score_tokens(self, prompt: int, cached: int, shared: bool) -> None:
        """An answered scoring request: tokens submitted, tokens reused, and whether it was sent shared."""
        self.score_tokens["prompt"] += prompt
        self.score_tokens["cached"] += cached
        self.shared_requests["true" if shared else "false"] += 1

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self.gauges[name] = (help_text, read)

    def render(self) -> str:
        lines = ["# HELP boundserve_requests_total HTTP requests by route and outcome (ok or error code).",
                 "# TYPE boundserve_requests_total counter"]
        for (route, outcome), n in sorted(self.requests.items()):
            lines.append(f'boundserve_requests_total{{route="{route}",outcome="{outcome}"}} {n}')
        lines += ["# HELP boundserve_drops_total Requests refused or dropped, by reason.",
                  "# TYPE boundserve_drops_total counter"]
        lines += [f'boundserve_drops_total{{reason="{r}"}} {n}' for r, n in sorted(self.drops.items())]
        lines += ["# HELP boundserve_stage_latency_ms Milliseconds spent per request in each stage.",
                  "# TYPE boundserve_stage_latency_ms histogram"]
        for stage, hist in self.stage_ms.items():
            lines += hist.lines("boundserve_stage_latency_ms", f'stage="{stage}"')
        lines += ["# HELP boundserve_batch_fill Fraction of the compiled batch bound a sent batch used.",
                  "# TYPE boundserve_batch_fill histogram"]
        for workload, hist in sorted(self.batch_fill.items()):
            lines += hist.lines("boundserve_batch_fill", f'workload="{workload}"')
        lines += self._score_token_lines()
        for name, (help_text, read) in sorted(self.gauges.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {read():.6g}"]
        return "\n".join(lines) + "\n"

    def _score_token_lines(self) -> list[str]:
        return [
            "# HELP boundserve_score_prompt_tokens_total Prompt tokens of answered scoring requests (samples whole).",
            "# TYPE boundserve_score_prompt_tokens_total counter",
            f"boundserve_score_prompt_tokens_total {self.score_tokens['prompt']}",
            "# HELP boundserve_score_cached_tokens_total Tokens of answered scoring requests whose keys/values the "
            "workers reused instead of computing (a shared prefix after its first use, the static prefix).",
            "# TYPE boundserve_score_cached_tokens_total counter",
            f"boundserve_score_cached_tokens_total {self.score_tokens['cached']}",
            "# HELP boundserve_score_shared_requests_total Answered scoring requests, by whether their samples "
            "were sent as one shared prefix plus suffixes.",
            "# TYPE boundserve_score_shared_requests_total counter",
            *(f'boundserve_score_shared_requests_total{{shared="{k}"}} {n}' for k, n in self.shared_requests.items()),
        ]
