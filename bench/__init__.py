"""Benchmarks: each script runs as `.venv/bin/python bench/<name>.py`, prints one JSON object as its
last line and writes it under bench/results/. The package holds their shared parts: provenance.py
(what ran where, and the result file), common.py (real-shape checkpoints, the one node builder, the
measured peak, interleaved timing), parity.py (the agreement every result asserts), flops.py
(executed FLOPs), hf_baselines.py, ct2_baseline.py and openvino_baseline.py (the peers), e2e_stack.py
(end-to-end runs on loadgen's stack, open-loop replayer and stats); overload_load.py,
overload_window.py and overload_summary.py are overload.py's (its load, one window, its figures).
Stacks, ports, readiness, open-loop load, percentiles and goodput are loadgen's (loadgen/stack.py,
live.py, replayer.py, stats.py), so a figure from bench/ and one from loadgen mean the same thing.
bench imports the product's packages, never the tests."""
