"""The runtime that loads and calls compiled packages: artifacts, node classes, staging, the allocator, kernels.

The worker runs this package; the offline build (compile/) imports it to check what it built, never the
other way round: nothing here imports compile/ (tests/test_layering.py).
"""
