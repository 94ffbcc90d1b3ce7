"""One scoring call through the compiled artifacts: proves a build end to end (`make serve` until the gateway lands)."""

from __future__ import annotations

import argparse
import json

import torch
from tokenizers import Tokenizer

from compile.runtime import load_nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--artifacts", required=True)
    args = parser.parse_args()
    nodes = load_nodes(args.artifacts)
    tokenizer = Tokenizer.from_file(f"{args.artifacts}/tokenizer.json")
    samples = ["best running shoe for summer", "cheap phone case red", "hotel near the beach"]
    encoded = tokenizer.encode_batch(samples, add_special_tokens=False)
    ids = torch.tensor([i for e in encoded for i in e.ids])
    lens = torch.tensor([len(e.ids) for e in encoded])
    labels = [tokenizer.token_to_id(t) for t in ("yes", "no")]
    out = nodes.score(ids, lens, torch.tensor(labels), top_k=3)
    for text, probs, top in zip(samples, out.label_probs.tolist(), out.topk_ids.tolist()):
        print(json.dumps({"sample": text, "p(yes), p(no)": [round(p, 4) for p in probs],
                          "top3": [tokenizer.id_to_token(i) for i in top]}))


if __name__ == "__main__":
    main()
