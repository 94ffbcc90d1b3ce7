"""Benchmarks: each script runs as `.venv/bin/python bench/<name>.py`, prints one JSON object as its
last line and writes it under bench/results/. The package holds their shared parts: provenance.py
(what ran where, and the result file), common.py (real-shape checkpoints, the measured peak,
interleaved timing), parity.py (the agreement every result asserts), flops.py (executed FLOPs),
hf_baselines.py and ct2_baseline.py (the peers), e2e_stack.py (a local stack for end-to-end runs);
overload_load.py, overload_window.py and overload_summary.py are overload.py's (its load, one window, its figures).
bench imports the product's packages, never the tests."""
