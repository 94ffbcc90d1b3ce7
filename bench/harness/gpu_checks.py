"""The GPU-path checks of bench/gpu_suite.py: no host sync inside a node call, and two lanes overlapping.

no_host_sync: each node's enqueue — bounds check, layout, pinned input copies, the package call,
output copies into pinned buffers, the event — runs under torch.cuda.set_sync_debug_mode("error"),
so any synchronising CUDA call made through torch inside raises; the wait (Pending.result()) comes
after, outside the mode, as the worker's lanes do it (worker/lanes.py). The launch's and the whole
call's times are reported too: a sync the mode cannot see (inside AOTInductor's C++ runtime) would
make the launch as long as the call. On the CPU smoke run the same launch path runs
without the mode (there is no device to sync with) and the check reports itself not applicable.

lane_overlap: the worker's own lanes (worker/lanes.py: a CUDA stream each, one turn held for the
enqueue only), two threads each running the same number of one-request batches on its lane, against
one thread running them alone: overlap = 2 x one lane's time / two lanes' time (1.0: the lanes took
turns; 2.0: the second lane cost nothing). On the CPU smoke run two CPU lanes run the same code to
prove it runs; the figure says nothing there (two CPU lanes split the same few cores, and on a
busy 2-core machine OpenMP contention dominates: 2.3-6.3 measured at load ~10, one lane timed on the
main thread; bench/cpu_lanes.py is the CPU measurement).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from bench.harness.common import run_together
from bench.harness.gpu_measure import BEAM_K, BEAM_S, BEAM_W, Settings, labels, random_samples, score_requests


def launches(nodes, spec, s: Settings) -> dict:
    """name -> launch(staging) of one representative call of each node."""
    samples = score_requests(s, spec.vocab_size, 1, seed=11)[0]
    ids, lens, lab = torch.cat(samples), torch.tensor([len(x) for x in samples]), torch.tensor(labels(spec.vocab_size))
    calls = {"score": lambda staging: nodes.score.launch(ids, lens, lab, 5, staging=staging)}
    if nodes.beam is not None:
        prompts = random_samples(2, *s.beam_prompts, spec.vocab_size, torch.Generator().manual_seed(12))
        p_ids, p_lens = torch.cat(prompts), torch.tensor([len(p) for p in prompts])
        calls["beam"] = lambda staging: nodes.beam.launch(p_ids, p_lens, BEAM_W, BEAM_S, BEAM_K, staging=staging)
    return calls


def no_host_sync(nodes, spec, s: Settings) -> dict:
    """Per node: did its enqueue run without a host sync (ok), and the error if not."""
    from worker.runtime.transfer import Staging

    on_gpu = s.device == "cuda"
    staging = Staging("cuda:0" if on_gpu else "cpu")
    result = {"applicable": on_gpu}
    for name, launch in launches(nodes, spec, s).items():
        launch(staging).result()  # warm-up: the staging buffers are allocated (pinned) once
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        start = time.perf_counter()
        try:
            pending, error = launch(staging), None
        except RuntimeError as exc:  # the sync debug mode raises on the first synchronising call
            pending, error = None, str(exc)
        finally:
            if on_gpu:
                torch.cuda.set_sync_debug_mode("default")
        launched = time.perf_counter()
        if pending is not None:
            pending.result()
        # The debug mode sees syncs made through torch; one inside AOTInductor's own C++ (a model
        # instance waiting for its previous run) would show as a launch as long as the whole call.
        result[name] = {"ok": error is None, "error": error, "launch_ms": 1e3 * (launched - start),
                        "call_ms": 1e3 * (time.perf_counter() - start)}
    result["ok"] = all(v["ok"] for k, v in result.items() if isinstance(v, dict))
    return result


def lane_overlap(nodes, spec, s: Settings, batches: int, rounds: int = 3) -> dict:
    """Two lanes running `batches` one-request scoring batches each, at once, against one lane alone
    (median seconds of `rounds` alternated rounds)."""
    from shared.config import WorkerConfig
    from worker.lanes import Lane, make_lanes, max_staged_tokens

    bounds = nodes.manifest.bounds  # what the nodes were compiled with (a Bounds, as the worker's lanes take)
    if s.device == "cuda":  # the nodes were loaded with a runner per lane
        lanes = make_lanes("cuda:0", WorkerConfig(num_streams=2), bounds)
    else:
        lanes = [Lane("cpu", max_staged_tokens(bounds)) for _ in range(2)]
    launch = launches(nodes, spec, s)["score"]

    def run(lane) -> None:
        for _ in range(batches):
            with lane.enqueueing():
                pending = launch(lane.staging)
            pending.result()

    run(lanes[0]), run(lanes[1])  # warm-up: staging buffers, kernels
    ones, twos = [], []
    for _ in range(rounds):  # alternated, medians: one slow round (another process) moves neither much
        # one lane on a thread of its own too: on the CPU a call from the main thread ran 3x slower
        # than from another thread on this busy 2-core machine (an OpenMP effect), as in the worker
        ones.append(run_together([functools.partial(run, lanes[0])]))
        twos.append(run_together([functools.partial(run, lane) for lane in lanes]))
    one, two = statistics.median(ones), statistics.median(twos)
    return {"batches_per_lane": batches, "rounds": rounds, "one_lane_s": one, "two_lanes_s": two,
            "overlap": 2 * one / two,
            "lanes": f"{'CUDA streams' if s.device == 'cuda' else 'CPU lanes'}, one turn for the enqueue"}
