"""What the check asks the running stack over HTTP, and what counts as a right answer.

The answer checks are pure functions of the decoded JSON (tested without a stack); `http_json` and
`wait_for` are the only I/O, each bounded by a timeout.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

HTTP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 1.0
SCORE_BODY = {"samples": ["red running shoe", "blue phone case"], "labels": ["yes", "no"], "deadline_ms": 30_000}
GENERATE_BODY = {"prompt": "red running", "beam_width": 4, "max_new_tokens": 3, "num_return_sequences": 2,
                 "deadline_ms": 30_000}
SCRAPE_JOB = "boundserve-gateway"  # configs/prometheus.yml
ROUTES = ("/v1/score", "/v1/generate")


def http_json(url: str, body: dict | None = None, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, dict]:
    """(status, decoded body) of a GET, or a POST when `body` is given; (0, {error}) if unreachable."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, _json_or_text(error.read())
    except (urllib.error.URLError, OSError) as error:
        return 0, {"error": str(error)}


def _json_or_text(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode(errors="replace")[:500]}


def wait_for(what: str, probe: Callable[[], str | None], timeout_s: float,
             interval_s: float = POLL_INTERVAL_S) -> None:
    """Poll `probe` (None = done, else why not yet) until done; TimeoutError with the last reason."""
    end = time.monotonic() + timeout_s
    while True:
        reason = probe()
        if reason is None:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s; last seen: {reason}")
        time.sleep(interval_s)


def score_problems(status: int, body: dict, num_samples: int, num_labels: int) -> list[str]:
    """Why a /v1/score answer to SCORE_BODY is wrong (empty: right)."""
    if status != 200:
        return [f"status {status}: {body}"]
    scores = body.get("scores")
    if not isinstance(scores, list) or len(scores) != num_samples:
        return [f"expected {num_samples} rows of scores, got {scores!r}"]
    problems = []
    for i, row in enumerate(scores):
        if len(row) != num_labels or not all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in row):
            problems.append(f"row {i} is not {num_labels} probabilities: {row}")
        elif abs(sum(row) - 1.0) > 1e-4:
            problems.append(f"row {i} sums to {sum(row)}, not 1")
    return problems


def generate_problems(status: int, body: dict, num_sequences: int, max_new_tokens: int) -> list[str]:
    """Why a /v1/generate answer to GENERATE_BODY is wrong (empty: right)."""
    if status != 200:
        return [f"status {status}: {body}"]
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or len(candidates) != num_sequences:
        return [f"expected {num_sequences} candidates, got {candidates!r}"]
    problems = []
    for i, candidate in enumerate(candidates):
        tokens, score = candidate.get("token_ids"), candidate.get("score")
        if not tokens or len(tokens) > max_new_tokens or not all(isinstance(t, int) for t in tokens):
            problems.append(f"candidate {i} has token ids {tokens!r} (1..{max_new_tokens} expected)")
        if not isinstance(score, float) or not math.isfinite(score) or score > 0:
            problems.append(f"candidate {i} has score {score!r} (a finite log-probability expected)")
    scores = [c.get("score") for c in candidates]
    if not problems and scores != sorted(scores, reverse=True):
        problems.append(f"candidates are not best first: {scores}")
    return problems


def prometheus_query(base_url: str, query: str) -> list[dict]:
    """The result vector of an instant query (empty when Prometheus is unreachable or errs)."""
    status, body = http_json(f"{base_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
    if status != 200 or body.get("status") != "success":
        return []
    return body["data"]["result"]


def scrape_problem(up: list[dict], requests: list[dict]) -> str | None:
    """Why Prometheus has not yet scraped what the check sent (None: it has).

    `up` is the result of `up{job=SCRAPE_JOB}`; `requests` of `boundserve_requests_total{job=SCRAPE_JOB,
    outcome="ok"}`: each of ROUTES must have been counted at least once.
    """
    if not up:
        return f"no target of job {SCRAPE_JOB}"
    if any(sample["value"][1] != "1" for sample in up):
        return f"target down: {up}"
    counted = {s["metric"].get("route") for s in requests if float(s["value"][1]) >= 1}
    missing = [route for route in ROUTES if route not in counted]
    return f"not yet scraped: ok requests on {', '.join(missing)}" if missing else None


def rules_problem(groups: list[dict], group: str = "boundserve") -> str | None:
    """Why Prometheus has not loaded configs/prometheus-rules.yml cleanly (None: it has).

    `groups` is /api/v1/rules' data.groups; a rule is "unknown" until first evaluated, "err" if it fails.
    """
    rules = [rule for g in groups if g.get("name") == group for rule in g.get("rules", [])]
    if not rules:
        return f"rule group {group} not loaded"
    failing = [f"{rule['name']}: {rule.get('lastError')}" for rule in rules if rule.get("health") == "err"]
    return f"rules failing: {failing}" if failing else None
