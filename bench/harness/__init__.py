"""What every benchmark is built on: provenance, parity, FLOP counts, the peers' runners, stacks and load.

The runnable benchmarks sit one level up (bench/*.py); nothing here is run on its own."""
