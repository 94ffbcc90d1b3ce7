"""`python -m worker --config configs/x.toml --artifacts artifacts/x [--endpoint E] [--device D]`.

Endpoint and device default to entry --index of [worker] endpoints/devices. SIGTERM or SIGINT
drains (finish and answer accepted batches) and exits 0. The last fitted latency profile is kept in
--profile-cache (default $XDG_CACHE_HOME/boundserve/profiles, or ~/.cache/...), so a restart serves
after a short warm-up and refits in the background; `--profile-cache none` always profiles first.
`--standby` does the imports a start spends its first seconds on, then waits for one JSON line on
stdin naming its endpoint, device and index (the supervisor's spare for a fast restart; EOF: exit 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from shared.config import ConfigError, load_config
from shared.events import Standby
from shared.logs import json_logging
from worker.logs import JsonLog


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="deployment TOML")
    parser.add_argument("--artifacts", required=True, help="folder written by `python -m compile`")
    parser.add_argument("--endpoint", help="tcp://host:port or ipc://path to bind (default: from config)")
    parser.add_argument("--device", help="cpu or cuda:N (default: from config)")
    parser.add_argument("--index", type=int, default=0, help="which [worker] entry supplies the defaults")
    parser.add_argument("--worker-id", help="name in logs and heartbeats (default: worker-<pid>)")
    parser.add_argument("--profile-cache", help="folder of the last fitted latency profiles, or `none` "
                        "(default: $XDG_CACHE_HOME/boundserve/profiles)")
    parser.add_argument("--standby", action="store_true", help="import, then wait for an assignment on stdin")
    parser.add_argument("--debug", action="store_true", help="debug-level logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with json_logging(logging.DEBUG if args.debug else logging.INFO):
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Start (or stand by for an assignment), serve until stopped; 2 when the start is refused."""
    worker_id = args.worker_id or f"worker-{os.getpid()}"
    log = JsonLog(worker_id)
    stop = {"requested": False, "server": None}

    def on_signal(signum, frame):
        stop["requested"] = True
        if stop["server"] is not None:
            stop["server"].request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.standby and not _assigned(args, log):
        return 0
    try:
        config = load_config(args.config)
        entries = len(config.worker.endpoints)
        if not 0 <= args.index < entries:
            raise ConfigError(f"--index {args.index}: {args.config} has {entries} [worker] entr"
                              f"{'y' if entries == 1 else 'ies'}, 0 to {entries - 1}")
        endpoint = args.endpoint or config.worker.endpoints[args.index]
        device = args.device or config.worker.devices[args.index]
        from worker.startup import build_server  # imports torch: after argument errors are reported

        server = build_server(config, args.artifacts, device, endpoint, worker_id, log, _profile_folder(args))
    except (ConfigError, RuntimeError, ValueError, OSError) as exc:
        log.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        return 2
    if stop["requested"]:
        log.info("stopped_before_serving")
        return 0
    stop["server"] = server
    return server.run()


def _assigned(args: argparse.Namespace, log: JsonLog) -> bool:
    """As a standby: import and probe now, then take endpoint, device and index from stdin (False on EOF)."""
    import torch._inductor.package  # noqa: F401  (the package loader: about a second of imports)
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    import worker.startup  # noqa: F401  (torch and the runtime)

    pick_vec_isa()  # every package load asks for the CPU's vector ISA: 1-3 s of probing, cached per process

    log.emit(Standby())
    line = sys.stdin.readline()
    if not line:
        return False
    assignment = json.loads(line)
    args.endpoint, args.device, args.index = assignment["endpoint"], assignment["device"], assignment["index"]
    log.info("assigned", endpoint=args.endpoint, device=args.device, index=args.index)
    return True


def _profile_folder(args: argparse.Namespace) -> Path | None:
    from worker.profile_cache import default_folder

    if args.profile_cache == "none":
        return None
    return Path(args.profile_cache) if args.profile_cache else default_folder(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
