"""The bounded beam-search node: module.py (the exported forward + its export and node builder),
search.py (one beam step), attention.py (shared-prompt attention), decode.py (the decode pass over
the model core's prefill), processors.py (repetition penalty, prefix constraints), generation_config.py (the
checkpoint's generation options), node.py (the worker-side runner).
Imports torch, shared and compile's model core."""
