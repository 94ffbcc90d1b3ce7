"""Throughput of one worker under a continuous stream of scoring batches, by number of CUDA streams.

Starts `python -m worker` once per stream count (num_streams = 1 is the baseline of the same run),
keeps its queue full with 15-sample x 256-token batches and reports batches/s and the ratio to one
stream. The one-stream baseline runs first and again last, and the spread of those two runs is
reported as the noise floor: a ratio inside it is no gain. A ratio is only reported between runs
that used different numbers of lanes; a CPU worker always runs one lane, so there it is null.

    python bench/worker_streams.py --device cuda:0 [--streams 1,2,4] [--artifacts DIR] [--quick]

Without --artifacts it writes the demo checkpoint and compiles it with configs/demo.toml for the
device kind (cached in bench/.cache/worker_streams/).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from bench.harness.provenance import ROOT, write_result
from loadgen.processes import spawn
from shared import protocol
from shared.config import WorkerConfig

CACHE = ROOT / "bench" / ".cache" / "worker_streams"
SAMPLES, TOKENS = 15, 256


def build_artifacts(device: str) -> Path:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    model, out = CACHE / "model", CACHE / f"artifacts-{kind}"
    if not (model / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "compile.demo", "--out", str(model)], cwd=ROOT, check=True)
    subprocess.run([sys.executable, "-m", "compile", "--config", "configs/demo.toml", "--model", str(model),
                    "--device", kind, "--out", str(out)], cwd=ROOT, check=True)
    return out


def write_config(folder: Path, endpoint: str, device: str, streams: int) -> Path:
    text = re.sub(r"(?ms)^\[worker\].*?(?=^\[|\Z)", "", (ROOT / "configs" / "demo.toml").read_text())
    text += (f'\n[worker]\nendpoints = ["{endpoint}"]\ndevices = ["{device}"]\nnum_streams = {streams}\n'
             "max_queued_batches = 8\nprofile_budget_s = 1.0\n")
    path = folder / f"streams-{streams}.toml"
    path.write_text(text)
    return path


def make_batch(batch_id: int, vocab: int, rng) -> protocol.ScoreBatch:
    ids = rng.integers(0, vocab, size=SAMPLES * TOKENS)
    request = protocol.ScoreRequest(f"r{batch_id}", 60_000.0, protocol.pack_ids(ids), (TOKENS,) * SAMPLES, (1, 2), 5, False)
    return protocol.ScoreBatch(batch_id=batch_id, token_dtype="int32", requests=(request,))


def recv(sock: zmq.Socket, timeout_s: float):
    if not sock.poll(int(timeout_s * 1000)):
        raise TimeoutError(f"worker silent for {timeout_s} s")
    return protocol.decode(sock.recv_multipart())


def drive(sock: zmq.Socket, ready: protocol.Ready, total: int, window: int) -> dict:
    """Keep `window` batches outstanding until `total` are answered ok; batches/s over that span."""
    rng = np.random.default_rng(0)
    batches = [make_batch(i, int(ready.model["vocab_size"]), rng) for i in range(window)]
    next_id, done, resent, compute = window, 0, 0, []
    start = time.perf_counter()
    for batch in batches:
        sock.send_multipart(protocol.encode(batch))
    while done < total:
        message = recv(sock, 120.0)
        if isinstance(message, protocol.ScoreResults):
            done += 1
            compute.append(message.compute_ms)
        elif isinstance(message, protocol.Error) and message.code == protocol.ErrorCode.OVERLOADED:
            resent += 1
        elif isinstance(message, protocol.Error):
            raise RuntimeError(f"the worker refused a batch: {message}")
        else:
            continue  # heartbeats and other status messages
        template = batches[next_id % window]
        sock.send_multipart(protocol.encode(protocol.ScoreBatch(next_id, "int32", template.requests)))
        next_id += 1
    elapsed = time.perf_counter() - start
    return {"batches_per_s": round(done / elapsed, 2), "samples_per_s": round(done * SAMPLES / elapsed, 1),
            "mean_compute_ms": round(float(np.mean(compute)), 3), "overloaded_resent": resent}


def run_worker(artifacts: Path, device: str, streams: int, total: int, folder: Path) -> dict:
    endpoint = f"ipc://{folder}/w{streams}.sock"
    config = write_config(folder, endpoint, device, streams)
    worker = spawn([sys.executable, "-m", "worker", "--config", str(config), "--artifacts", str(artifacts)],
                   folder / f"worker-{streams}.log", cwd=ROOT)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(protocol.encode(protocol.Hello(protocol.PROTOCOL_VERSION, "bench")))
        ready = recv(sock, 600.0)
        if not isinstance(ready, protocol.Ready):
            raise RuntimeError(f"worker answered Hello with {ready}")
        result = drive(sock, ready, total, window=ready.max_queued_batches)  # queue + lanes never overflow
        result["lanes"] = ready.num_streams
        sock.send_multipart(protocol.encode(protocol.Shutdown(reason="bench done")))
        worker.wait(timeout=120)
        return result
    finally:
        if worker.poll() is None:
            worker.kill()
        sock.close()
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--streams", default="1,2,4", help="comma-separated stream counts; 1 is the baseline")
    parser.add_argument("--artifacts", help="compiled artifacts for --device (default: build the demo model)")
    parser.add_argument("--batches", type=int, default=None, help="batches answered per stream count")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    counts = sorted({1, *(int(s) for s in args.streams.split(","))})
    total = args.batches or (100 if args.quick else 1000)
    artifacts = Path(args.artifacts) if args.artifacts else build_artifacts(args.device)
    out = {"bench": "worker_streams", "device": args.device, "samples": SAMPLES, "tokens_per_sample": TOKENS,
           "batches": total, "streams": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [*counts, 1]:  # the baseline again at the end: its spread is the noise floor
            key = str(n) if str(n) not in out["streams"] else f"{n} (again)"
            out["streams"][key] = run_worker(artifacts, args.device, n, total, Path(tmp))
            print(f"streams={key}: {out['streams'][key]}", file=sys.stderr)
    out |= ratios(out["streams"])
    threads = {"worker_cpu_threads": WorkerConfig.cpu_threads if args.device == "cpu" else None}  # config default
    write_result("worker_streams" + ("-quick" if args.quick else ""), out, quick=args.quick, threads=threads)


def ratios(runs: dict) -> dict:
    """batches/s over the one-stream baseline (mean of its two runs), only where the lanes differ."""
    first, again = runs["1"]["batches_per_s"], runs["1 (again)"]["batches_per_s"]
    base, lanes = (first + again) / 2, runs["1"]["lanes"]
    noise = abs(first - again) / base
    ratio = {n: (round(r["batches_per_s"] / base, 3) if r["lanes"] != lanes else None)
             for n, r in runs.items() if n not in ("1", "1 (again)")}
    note = None
    if all(r["lanes"] == lanes for r in runs.values()):
        note = f"every run used {lanes} lane(s): the stream count changes nothing on this device"
    return {"baseline_spread": round(noise, 3), "ratio_vs_1_stream": ratio, "note": note}


if __name__ == "__main__":
    main()
