"""`python -m compile --model DIR --config configs/<name>.toml --out artifacts/<name>`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from compile.build import build
from compile.checkpoint import UnsupportedCheckpoint
from shared.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compile", description=__doc__)
    parser.add_argument("--config", required=True, help="deployment config (TOML)")
    parser.add_argument("--model", help="checkpoint folder; overrides model.path of the config")
    parser.add_argument("--out", required=True, help="artifacts folder to write")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="overrides model.device (and the workers' devices, which must be of its kind)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="overrides model.dtype")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        overrides = {k: v for k, v in (("path", args.model), ("device", args.device), ("dtype", args.dtype)) if v}
        sections = {"model": dataclasses.replace(config.model, **overrides)}
        if args.device and args.device != config.model.device:  # the workers of these artifacts run that kind too
            devices = tuple("cpu" if args.device == "cpu" else "cuda:0" for _ in config.worker.devices)
            sections["worker"] = dataclasses.replace(config.worker, devices=devices)
        config = config.replace(**sections)
        build(config, args.out, force=args.force)
    except (ConfigError, UnsupportedCheckpoint, ValueError, FileNotFoundError) as exc:
        print(f"compile: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
