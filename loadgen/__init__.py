"""Open-loop load generation for boundserve: traces, replay, reports, sweeps and deadline tuning.

Entry point: `python -m loadgen replay|sweep|tune|import|synth ...` (see loadgen/__main__.py).
Never imports torch, transformers, worker or compile (tests/test_layering.py).
"""
