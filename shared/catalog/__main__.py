"""python -m shared.catalog convert SEQUENCES OUT.npz --vocab-size V --max-new-tokens S

Builds a catalogue's trie file (shared/catalog/trie_file.py) from a sequences file (text or .npy),
offline, so that a worker's swap reads four arrays instead of sorting the sequences.
"""

from __future__ import annotations

import argparse
import sys
import time

from shared.catalog.trie import build_trie, read_sequences
from shared.catalog.trie_file import SUFFIX, write_trie


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.catalog", description=__doc__.splitlines()[2])
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="a sequences file -> a trie file")
    convert.add_argument("sequences", help="text (ids per line) or .npy [N, L] padded with -1")
    convert.add_argument("out", help=f"the trie file to write ({SUFFIX})")
    convert.add_argument("--vocab-size", type=int, required=True,
                         help="the model's vocabulary (manifest model.vocab_size)")
    convert.add_argument("--max-new-tokens", type=int, required=True, help="bounds.max_new_tokens of the build")
    args = parser.parse_args(argv)
    if not args.out.endswith(SUFFIX):
        parser.error(f"out must end in {SUFFIX}: {args.out}")
    start = time.perf_counter()
    try:
        trie = build_trie(read_sequences(args.sequences), args.vocab_size, args.max_new_tokens)
    except (OSError, ValueError) as exc:
        print(f"{args.sequences}: {exc}", file=sys.stderr)
        return 2
    write_trie(args.out, trie)
    print(f"{args.out}: {trie.num_items} sequences, {trie.num_nodes} nodes, fan-out {trie.fan_out} "
          f"({time.perf_counter() - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
