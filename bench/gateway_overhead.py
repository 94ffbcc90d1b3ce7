"""Gateway overhead: what one `python -m gateway` process adds to a 15-sample scoring request.

Runs, in one go on this machine: a stand-in worker process that answers instantly over the real
protocol (loadgen/standin_worker.py), the real gateway process, and a light keep-alive HTTP
client. Measures (1) the tokenizer's own time for each request's samples (one encode_batch call,
in this process), (2) sequential end-to-end latency, and (3) the most requests/s the gateway
sustains under concurrent load, with the gateway process's own CPU time per request (what one
dedicated core could sustain: 1000 / that). Overhead = end-to-end latency - the tokenizer's time on the same
samples, measured right before the request (so the machine's drift cancels).
Baseline in the same run: GET /healthz round trips (HTTP + client floor, no gateway work).

    python bench/gateway_overhead.py [--quick] [--artifacts DIR] [--telemetry-rounds N]

Prints one JSON object as its last line and writes it to bench/results/gateway_overhead.json.
With --telemetry-rounds N it measures instead the cost of tracing ([telemetry], gateway/telemetry.py):
N rounds, each one run with tracing off and one with it on (exporting over OTLP/HTTP to a sink in
this process that answers 200), their order alternating round by round so the machine's drift falls
on both alike; it writes gateway_overhead-telemetry.json with every run and the spread per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness.provenance import write_result
from loadgen.live import wait_ready
from loadgen.processes import free_port
from loadgen.stack import start_standin_stack
from loadgen.stats import percentile as pct

WORDS = ("red blue running shoe phone case cheap premium free shipping review rating coffee tea book laptop "
         "camera watch bag hotel flight city beach summer winter best top near me how why search click").split()


def samples_for(rng: random.Random, count: int = 15) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(count)]


def tokenizer_folder(artifacts: str | None, scratch: Path) -> Path:
    if artifacts:
        return Path(artifacts)
    from compile.demo import train_tokenizer  # the demo model's tokenizer, trained locally

    train_tokenizer().save(str(scratch / "tokenizer.json"))
    return scratch


class Client:
    """HTTP/1.1 keep-alive over one connection: pre-encoded requests, minimal response parsing."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return status, await self.reader.readexactly(length)


def post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


GET_HEALTH = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"


async def sequential(port: int, requests: list[bytes]) -> list[float]:
    client = await Client.connect(port)
    times = []
    for request in requests:
        start = time.perf_counter()
        status, body = await client.call(request)
        times.append((time.perf_counter() - start) * 1000)
        assert status == 200, body[:300]
    client.writer.close()
    return times


async def paired(port: int, requests: list[bytes], bodies: list[list[str]], encode, n: int):
    """Per request: the tokenizer's own time on its samples, then its end-to-end latency, back to back."""
    client = await Client.connect(port)
    latency, tokenize = [], []
    for i in range(n):
        start = time.perf_counter()
        encode(bodies[i % len(bodies)])
        tokenize.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        status, body = await client.call(requests[i % len(requests)])
        latency.append((time.perf_counter() - start) * 1000)
        assert status == 200, body[:300]
    client.writer.close()
    return latency, tokenize


async def load(port: int, requests: list[bytes], concurrency: int, seconds: float) -> tuple[float, int]:
    end = time.perf_counter() + seconds
    done = errors = 0

    async def one_connection(offset: int) -> None:
        nonlocal done, errors
        client = await Client.connect(port)
        i = offset
        while time.perf_counter() < end:
            status, _ = await client.call(requests[i % len(requests)])
            done += 1
            errors += status != 200
            i += 1
        client.writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_connection(k) for k in range(concurrency)))
    return done / (time.perf_counter() - start), errors


def start_stack(folder: Path, port: int, offload_chars: int, traces_to: str | None = None) -> list[subprocess.Popen]:
    """The stand-in worker and the gateway; `traces_to`: an OTLP/HTTP endpoint to trace to (else tracing off)."""
    telemetry = f'[telemetry]\nenabled = true\nendpoint = "{traces_to}"\n' if traces_to else ""
    return start_standin_stack(folder, port, 1 << 20, "bench", "score_deadline_ms = 5000\nmax_queue_tokens = 10000000\n"
                               f"tokenize_offload_chars = {offload_chars}\n{telemetry}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), all its threads together."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """CPU time so far of a process's running children (the gateway's: its trace exporter, when tracing)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return sum(cpu_seconds(c) for c in children)


async def measure(args: argparse.Namespace, port: int, folder: Path, gateway_pid: int) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(0)
    bodies = [samples_for(rng) for _ in range(64)]
    requests = [post("/v1/score", {"samples": s, "labels": ["yes", "no"]}) for s in bodies]
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # what the gateway calls
    tokenize_ms = []
    for samples in bodies * 3:
        start = time.perf_counter()
        encode(samples)
        tokenize_ms.append((time.perf_counter() - start) * 1000)
    pretokenized = [post("/v1/score", {"samples": [{"input_ids": e.ids} for e in encode(s)],
                                       "labels": ["yes", "no"]}) for s in bodies]
    await wait_ready(f"http://127.0.0.1:{port}", 30.0)
    n = 200 if args.quick else 1000
    await sequential(port, requests[:32])  # warm-up
    floor = await sequential(port, [GET_HEALTH] * n)
    latency, paired_tokenize = await paired(port, requests, bodies, encode, n)
    overhead = (np.array(latency) - np.array(paired_tokenize)).tolist()  # same request, same moment: drift cancels
    seconds = 3.0 if args.quick else 10.0
    cpu_before, children_before = cpu_seconds(gateway_pid), children_cpu_seconds(gateway_pid)
    rps, errors = await load(port, requests, args.concurrency, seconds)
    cpu_ms_per_request = (cpu_seconds(gateway_pid) - cpu_before) * 1000 / max(1, rps * seconds)
    children_ms_per_request = (children_cpu_seconds(gateway_pid) - children_before) * 1000 / max(1, rps * seconds)
    rps_ids, errors_ids = await load(port, pretokenized, args.concurrency, seconds)
    return {
        "bench": "gateway_overhead", "samples_per_request": 15, "requests_timed": n,
        "tokenize_p50_ms": pct(paired_tokenize, 50), "tokenize_alone_p50_ms": pct(tokenize_ms, 50),
        "end_to_end_p50_ms": pct(latency, 50),
        "end_to_end_p99_ms": pct(latency, 99), "overhead_p50_ms": pct(overhead, 50),
        "overhead_p99_ms": pct(overhead, 99), "baseline_healthz_p50_ms": pct(floor, 50),
        "max_rps": round(rps, 1), "max_rps_pretokenized": round(rps_ids, 1), "load_errors": errors + errors_ids,
        "gateway_cpu_ms_per_request": round(cpu_ms_per_request, 3),
        "exporter_cpu_ms_per_request": round(children_ms_per_request, 3),
        "max_rps_per_gateway_core": round(1000 / cpu_ms_per_request, 1),
        "concurrency": args.concurrency, "tokenize_offload_chars": args.offload_chars,
        "cpus": os.cpu_count(), "note": "client, gateway and stand-in worker share this machine's CPUs",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter run (under a minute)")
    parser.add_argument("--artifacts", help="artifacts folder whose tokenizer.json to use (default: demo tokenizer)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--offload-chars", type=int, default=16384,
                        help="gateway.tokenize_offload_chars (0: every request is tokenized on a thread)")
    parser.add_argument("--telemetry-rounds", type=int, default=0,
                        help="measure tracing's cost instead: this many rounds of tracing off and on, interleaved")
    args = parser.parse_args()
    if args.telemetry_rounds:
        return telemetry_rounds(args)
    result = run_once(args, None)
    # the stand-in worker computes nothing; the gateway runs one event loop (tokenizing on it or, over
    # tokenize_offload_chars, on its executor)
    write_result("gateway_overhead" + ("-quick" if args.quick else ""), result, quick=args.quick,
                 threads={"worker": None, "gateway_event_loop": 1})


def run_once(args: argparse.Namespace, traces_to: str | None) -> dict:
    """One measured gateway process (with tracing to `traces_to`, else off)."""
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as scratch:
        folder = Path(scratch)
        source = tokenizer_folder(args.artifacts, folder)
        if source != folder:
            (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
        port = free_port()
        processes = start_stack(folder, port, args.offload_chars, traces_to)
        try:
            return asyncio.run(measure(args, port, folder, processes[0].pid))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=15)


def loop_cost_us(traces_to: str, requests: int = 2000) -> float:
    """CPU time on the calling thread per traced request (us) of every tracing hook one scoring request
    runs, called as gateway/app.py, gateway/metrics.py and gateway/worker_link.py call them, with the
    trace shipped to a real exporter process posting to `traces_to`: the event loop's share of tracing,
    measured alone (the end-to-end runs above bury it in the machine's noise)."""
    from types import SimpleNamespace

    from gateway.telemetry import Telemetry, stage_ended
    from shared.config import TelemetryConfig

    telemetry = Telemetry.of(TelemetryConfig(enabled=True, endpoint=traces_to))
    telemetry.start()
    clock, headers = time.monotonic, {"Host": "bench", "Content-Type": "application/json"}
    prediction = SimpleNamespace(wait_ms=1.0, service_ms=2.0)

    def one(k: int) -> None:
        arrived = clock()
        with telemetry.request("POST", "/v1/score", headers, arrived, clock) as trace:
            wire_id = f"bench-{k}"
            trace.span("receive", arrived, clock())
            telemetry.bind(wire_id, trace)
            stage_ended("tokenize", 0.3)
            stage_ended("admission", 0.01)
            job = SimpleNamespace(request_id=wire_id, enqueued_at=clock(), compute_ms=0.5, dispatched=prediction)
            telemetry.trace_of(wire_id).batch_sent(job, k, (1, 15, 600), 1.5, "ipc://worker", clock())
            telemetry.trace_of(wire_id).batch_answered(job, 0.1, 0.5, "ok", clock())
            trace.span("answer", clock(), clock())

    try:
        for k in range(requests):  # warm-up, paced as below: the exporter keeps up, nothing is dropped
            one(k)
            if k % 10 == 9:  # 500 requests/s at most
                time.sleep(0.02)
        times = []
        for k in range(requests):
            start = time.thread_time()
            one(k)
            times.append(time.thread_time() - start)
            if k % 10 == 9:  # 500 requests/s at most
                time.sleep(0.02)
    finally:
        telemetry.shutdown()
    assert telemetry.export.dropped_traces == 0, "the exporter fell behind: the measure is not of a steady state"
    return round(float(np.median(times)) * 1e6, 1)


TELEMETRY_KEYS = ("overhead_p50_ms", "overhead_p99_ms", "end_to_end_p50_ms", "max_rps", "gateway_cpu_ms_per_request",
                  "exporter_cpu_ms_per_request")


def telemetry_rounds(args: argparse.Namespace) -> None:
    """Tracing off and on, interleaved (off-on, then on-off, ...), with an OTLP/HTTP sink here."""
    import http.server
    import threading

    received = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            received.append(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    traces_to = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    runs = []
    try:
        for round_ in range(args.telemetry_rounds):
            for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
                result = run_once(args, traces_to if mode == "on" else None)
                runs.append({"round": round_, "tracing": mode, **{k: result[k] for k in TELEMETRY_KEYS}})
        exports_before = len(received)
        hooks_us = loop_cost_us(traces_to)
        assert len(received) > exports_before, "the hooks' traces never reached the OTLP sink"
    finally:
        sink.shutdown()
    assert received, "no export reached the OTLP sink: the runs with tracing on traced nothing"
    spread = {mode: {k: {"median": float(np.median([r[k] for r in runs if r["tracing"] == mode])),
                         "min": min(r[k] for r in runs if r["tracing"] == mode),
                         "max": max(r[k] for r in runs if r["tracing"] == mode)} for k in TELEMETRY_KEYS}
              for mode in ("off", "on")}
    result = {"bench": "gateway_overhead_telemetry", "rounds": args.telemetry_rounds, "runs": runs,
              "spread": spread, "otlp_exports_received": len(received), "otlp_bytes_received": sum(received),
              "on_minus_off_overhead_p50_ms": round(spread["on"]["overhead_p50_ms"]["median"]
                                                    - spread["off"]["overhead_p50_ms"]["median"], 3),
              "on_minus_off_cpu_ms_per_request": round(spread["on"]["gateway_cpu_ms_per_request"]["median"]
                                                       - spread["off"]["gateway_cpu_ms_per_request"]["median"], 3),
              "loop_us_per_traced_request": hooks_us,
              "on_exporter_cpu_ms_per_request": spread["on"]["exporter_cpu_ms_per_request"]["median"],
              "on_over_off_max_rps": round(spread["on"]["max_rps"]["median"] / spread["off"]["max_rps"]["median"], 3),
              "samples_per_request": 15, "concurrency": args.concurrency, "cpus": os.cpu_count(),
              "note": "client, gateway, stand-in worker and OTLP sink share this machine's CPUs; other sessions "
                      "load it too: compare the spreads, not single runs. gateway_cpu_ms_per_request is the gateway "
                      "process alone; exporter_cpu_ms_per_request its trace exporter process "
                      "(gateway/trace_export.py), which encodes and posts the spans"}
    write_result("gateway_overhead-telemetry" + ("-quick" if args.quick else ""), result, quick=args.quick,
                 threads={"worker": None, "gateway_event_loop": 1})

if __name__ == "__main__":
    main()
