"""The prefill-only scoring node: module.py (the exported forward), heads.py (pure head functions),
export.py (export for the bounds + the node builder), node.py (the worker-side runner).
Imports torch, shared and compile's model core."""
