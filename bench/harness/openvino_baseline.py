"""OpenVINO, the strongest CPU runtime we compare with: the same checkpoint converted once, scored through its API.

Conversion needs no hub access: transformers' own model is wrapped so that only each row's last token is
projected to the vocabulary and no KV cache is built (`use_cache=False`; with the cache the trace fails in the
cache's concatenation), converted with `openvino.convert_model` and saved as IR at full precision in bench/.cache.
Inputs are input_ids and attention_mask [B, L] and each row's last index [B]: rows are *right*-padded. Left
padding (transformers careful's batch) gives NaN logits in OpenVINO: a padding query sees no key, its softmax is
0/0, and the NaN it writes into its value row reaches the real tokens through a zero attention weight (0 * NaN);
right padding leaves every padding query a real key to see and no real token ever sees a padding one.

OpenVINO's own int8, the int8 peer of an int8 run: NNCF's weight compression (`nncf.compress_weights`, INT8_ASYM:
every linear's weights int8 per output channel with a zero point, activations in the inference precision), applied
once to the converted model and cached as its own IR; precision "int8-f32" or "int8-bf16" runs it at that hint.

Settings: `INFERENCE_PRECISION_HINT` follows the run's dtype (on a CPU with AVX512_BF16 OpenVINO's default is bf16,
so a float32 run must ask for f32), `INFERENCE_NUM_THREADS` = the run's threads, `PERFORMANCE_HINT` = LATENCY (one
stream: one request at a time, as every contender runs). The bench sweeps the micro-batch size (samples sorted by
length, left-padded); one sample per call was its fastest on every sweep we ran (micro-batches of 4: -12 %, the
whole request padded: -60 %, fp32, 4 layers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.harness.common import CACHE
from bench.harness.hf_baselines import length_sorted_chunks

PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16"}
INT8 = "int8-"
"""A precision's prefix for the NNCF-compressed model: "int8-f32" is int8 weights at the f32 hint."""


def peer_precision(dtype: torch.dtype, int8: bool) -> str:
    """OpenVINO's precision for a run in `dtype` (an int8 run: its base), int8 weights for an int8 run."""
    return (INT8 if int8 else "") + PRECISIONS[dtype]


def require_nncf():
    try:
        import nncf
    except ImportError as exc:
        raise SystemExit("nncf is not installed (OpenVINO's int8 for --dtype int8): `make bench` installs the bench "
                         "extra (.venv/bin/pip install -e '.[bench]'), or pass --no-openvino") from exc
    return nncf


def require_openvino():
    try:
        import openvino
    except ImportError as exc:
        raise SystemExit("openvino is not installed: `make bench` installs the bench extra "
                         "(.venv/bin/pip install -e '.[bench]'), or pass --no-openvino") from exc
    return openvino


class LastTokenLogits(torch.nn.Module):
    """transformers' causal LM returning only each row's last-token logits [B, V], without a KV cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, last_index):
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]  # [B, L, H]
        rows = hidden[torch.arange(hidden.shape[0]), last_index]  # [B, H]
        return self.model.lm_head(rows)


def right_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, Lmax] with each row left-aligned (padding id 0), and the attention mask [B, Lmax]."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return ids, mask


class OpenVinoModel:
    """A checkpoint converted to OpenVINO IR (cached), compiled once per precision for `threads` threads."""

    def __init__(self, checkpoint: Path, threads: int):
        self.ov = require_openvino()
        self.folder = CACHE / "openvino" / f"{checkpoint.name}-last-token-ov-{self.ov.__version__}"
        if not (self.folder / "model.xml").is_file():
            self._convert(checkpoint)
        self.core = self.ov.Core()
        self.model = self.core.read_model(str(self.folder / "model.xml"))
        self.threads = threads
        self.requests: dict[str, object] = {}

    @property
    def version(self) -> str:
        return self.ov.__version__

    def _convert(self, checkpoint: Path) -> None:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
        example = torch.randint(0, 100, (2, 16))
        i64 = self.ov.Type.i64
        with torch.no_grad():
            converted = self.ov.convert_model(
                LastTokenLogits(hf),
                example_input={"input_ids": example, "attention_mask": torch.ones_like(example),
                               "last_index": torch.tensor([15, 15])},
                input=[("input_ids", [-1, -1], i64), ("attention_mask", [-1, -1], i64), ("last_index", [-1], i64)])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ov.save_model(converted, str(self.folder / "model.xml"), compress_to_fp16=False)

    def int8_model(self):
        """The converted model with NNCF's int8 weight compression (INT8_ASYM), cached beside the float IR."""
        path = self.folder / "model-int8-weights.xml"
        if not path.is_file():
            nncf = require_nncf()
            compressed = nncf.compress_weights(self.core.read_model(str(self.folder / "model.xml")),
                                               mode=nncf.CompressWeightsMode.INT8_ASYM)
            self.ov.save_model(compressed, str(path), compress_to_fp16=False)
        return self.core.read_model(str(path))

    def request(self, precision: str):
        """An infer request of the model compiled at `precision`: "f32" or "bf16", or "int8-f32" / "int8-bf16" for the
        int8-weight model at that hint."""
        if precision not in self.requests:
            model = self.int8_model() if precision.startswith(INT8) else self.model
            compiled = self.core.compile_model(model, "CPU", {
                "INFERENCE_PRECISION_HINT": precision.removeprefix(INT8), "INFERENCE_NUM_THREADS": self.threads,
                "PERFORMANCE_HINT": "LATENCY"})
            self.requests[precision] = compiled.create_infer_request()
        return self.requests[precision]

    def logits(self, precision: str, samples: list[torch.Tensor], micro_batch: int) -> torch.Tensor:
        """Last-position logits [B, V] float32 in the request's order; length-sorted micro-batches."""
        request = self.request(precision)
        out: list[torch.Tensor | None] = [None] * len(samples)
        for chunk in length_sorted_chunks([len(s) for s in samples], micro_batch):
            ids, mask = right_padded([samples[i] for i in chunk])
            result = request.infer({"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                    "last_index": (mask.sum(-1) - 1).numpy()})
            logits = torch.from_numpy(np.array(result[0]))
            for row, index in enumerate(chunk):
                out[index] = logits[row]
        return torch.stack(out).float()
