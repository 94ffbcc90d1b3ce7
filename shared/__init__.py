"""What more than one process needs, declared once. Imports neither torch nor aiohttp (nor gateway,
worker, compile or loadgen): the gateway, the worker, the build chain and loadgen all import it.

    protocol/              the gateway <-> worker wire messages (msgspec, versioned) and their codec
    config.py              the deployment's TOML config, decoded and validated
    bounds.py              the compiled bounds (Bounds), one check per workload, their words, BoundsError
    prefix.py              shared token prefixes: detection, the static-prefix rule, computed tokens
    latency_model.py       T = (alpha*B + beta)*L + gamma*B + delta, fitted by the worker
    latency_correction.py  the fitted model corrected online from measured batches
    policy/                the one scheduling policy (admission, queue, batch plan, drops) that the
                           gateway serves with and loadgen's simulator replays
    logs.py                JSON-lines logging for every process
"""
