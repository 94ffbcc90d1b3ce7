"""Offline build chain and the torch runtime of the compiled nodes. Imports torch and shared only.

    checkpoint.py  Hugging Face folder -> ModelSpec + fused weights      model.py  the packed transformer
                   and the passes both nodes share (prefill, merge_partials)
    attention.py   attention over the key pool's segments, in the graph   machine.py  machine facts, compatibility
    kernels/       C++ operators the CPU packages call (attention, bf16 and fp32), built into the artifacts
    transfer.py    a call's host<->device copies without a host sync (pinned buffers, an event)
    score/         the prefill-only scoring node (module, heads, export, node)
    beam/          the bounded beam-search node (module and export, search, attention, decode,
                   processors, generation config, node)
    fp8.py         selective FP8 at build time                           demo.py   the demo checkpoint
    build.py       `python -m compile`: export + AOTInductor + manifest (offline only)
    artifacts.py   manifest, hashes, weights and package loading (build and runtime)
    runtime.py     load_nodes for a worker: never imports the build chain
"""
