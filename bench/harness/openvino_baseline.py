"""OpenVINO, the strongest CPU runtime we compare with: the same checkpoint converted once, scored through its API.

Conversion needs no hub access: transformers' own model is wrapped so that only each row's last token is
projected to the vocabulary and no KV cache is built (`use_cache=False`; with the cache the trace fails in the
cache's concatenation), converted with `openvino.convert_model` and saved as IR at full precision in bench/.cache.
Inputs are input_ids and attention_mask [B, L] and each row's last index [B]: rows are *right*-padded. Left
padding (transformers careful's batch) gives NaN logits in OpenVINO: a padding query sees no key, its softmax is
0/0, and the NaN it writes into its value row reaches the real tokens through a zero attention weight (0 * NaN);
right padding leaves every padding query a real key to see and no real token ever sees a padding one.

OpenVINO's own int8, the int8 peer of an int8 run, in two forms, each applied once to the converted model and cached
as its own IR, run at the base's hint:
  "int8-f32" / "int8-bf16"    NNCF's weight compression (`nncf.compress_weights`, INT8_ASYM: every linear's weights
                              int8 per output channel with a zero point, activations in the inference precision);
  "int8q-f32" / "int8q-bf16"  NNCF's full quantization (`nncf.quantize`, ModelType.TRANSFORMER: int8 weights and
                              int8 activations at FakeQuantize nodes, SmoothQuant first), calibrated on
                              CALIBRATION_SAMPLES random-id prompts (the benchmarks' models have random weights, and
                              our int8 node calibrates on random ids too).
An int8 run times both on its sweep request and keeps the faster of those that pass the one quantized bound
(fastest_int8; both recorded); where neither passes, OpenVINO runs at the base precision instead (its best setting
within the bound; bench/score_node.py).

Settings: `INFERENCE_PRECISION_HINT` follows the run's dtype (on a CPU with AVX512_BF16 OpenVINO's default is bf16,
so a float32 run must ask for f32), `INFERENCE_NUM_THREADS` = the run's threads, `PERFORMANCE_HINT` = LATENCY (one
stream: one request at a time, as every contender runs). The bench sweeps the micro-batch size (samples sorted by
length, left-padded); one sample per call was its fastest on every sweep we ran (micro-batches of 4: -12 %, the
whole request padded: -60 %, fp32, 4 layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bench.harness import parity
from bench.harness.common import CACHE, interleaved_round
from bench.harness.hf_baselines import length_sorted_chunks

PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16"}
INT8 = "int8-"
"""A precision's prefix for the NNCF-compressed model: "int8-f32" is int8 weights at the f32 hint."""
INT8_FULL = "int8q-"
"""A precision's prefix for the NNCF-quantized model: "int8q-f32" is int8 weights and activations at the f32 hint."""
CALIBRATION_SAMPLES, CALIBRATION_TOKENS, CALIBRATION_SEED = 8, (32, 160), 1234
"""Full quantization's calibration prompts: how many, their length range, the seed of their random ids."""


def peer_precision(dtype: torch.dtype, int8: bool) -> str:
    """OpenVINO's precision for a run in `dtype` (an int8 run: its base), int8 weights for an int8 run."""
    return (INT8 if int8 else "") + PRECISIONS[dtype]


def int8_precisions(dtype: torch.dtype) -> tuple[str, str]:
    """OpenVINO's two int8 forms at the hint of a run's base `dtype`: (weights only, weights and activations)."""
    return INT8 + PRECISIONS[dtype], INT8_FULL + PRECISIONS[dtype]


def is_int8(precision: str) -> bool:
    """Whether a precision is one of OpenVINO's int8 forms ("int8-bf16", "int8q-f32"), not a float one."""
    return base_hint(precision) != precision


def base_hint(precision: str) -> str:
    """The inference precision hint of a precision ("int8q-bf16" -> "bf16")."""
    return precision.removeprefix(INT8_FULL).removeprefix(INT8)


def calibration_prompts(vocab: int) -> list[torch.Tensor]:
    """CALIBRATION_SAMPLES prompts of random ids [n] (fixed seed), lengths within CALIBRATION_TOKENS."""
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    lengths = torch.randint(CALIBRATION_TOKENS[0], CALIBRATION_TOKENS[1] + 1, (CALIBRATION_SAMPLES,), generator=generator)
    return [torch.randint(0, vocab, (int(n),), generator=generator) for n in lengths]


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
        self.vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
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

    def quantized_model(self):
        """The converted model fully quantized by NNCF (int8 weights and activations, SmoothQuant), calibrated on
        calibration_prompts; cached beside the float IR."""
        path = self.folder / f"model-int8-full-{CALIBRATION_SAMPLES}x{CALIBRATION_SEED}.xml"
        if not path.is_file():
            nncf = require_nncf()
            feeds = [self._feed(*right_padded([prompt])) for prompt in calibration_prompts(self.vocab)]
            quantized = nncf.quantize(self.core.read_model(str(self.folder / "model.xml")), nncf.Dataset(feeds),
                                      model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds))
            self.ov.save_model(quantized, str(path), compress_to_fp16=False)
        return self.core.read_model(str(path))

    @staticmethod
    def _feed(ids: torch.Tensor, mask: torch.Tensor) -> dict:
        """The model's inputs for right-padded ids and mask [B, L]: each row's last index from its mask."""
        return {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "last_index": (mask.sum(-1) - 1).numpy()}

    def request(self, precision: str):
        """An infer request of the model compiled at `precision`: "f32" or "bf16", or "int8-f32" / "int8-bf16" for the
        int8-weight model at that hint, "int8q-f32" / "int8q-bf16" for the fully quantized one."""
        if precision not in self.requests:
            model = (self.quantized_model() if precision.startswith(INT8_FULL) else
                     self.int8_model() if precision.startswith(INT8) else self.model)
            compiled = self.core.compile_model(model, "CPU", {
                "INFERENCE_PRECISION_HINT": base_hint(precision), "INFERENCE_NUM_THREADS": self.threads,
                "PERFORMANCE_HINT": "LATENCY"})
            self.requests[precision] = compiled.create_infer_request()
        return self.requests[precision]

    def logits(self, precision: str, samples: list[torch.Tensor], micro_batch: int) -> torch.Tensor:
        """Last-position logits [B, V] float32 in the request's order; length-sorted micro-batches."""
        request = self.request(precision)
        out: list[torch.Tensor | None] = [None] * len(samples)
        for chunk in length_sorted_chunks([len(s) for s in samples], micro_batch):
            ids, mask = right_padded([samples[i] for i in chunk])
            result = request.infer(self._feed(ids, mask))
            logits = torch.from_numpy(np.array(result[0]))
            for row, index in enumerate(chunk):
                out[index] = logits[row]
        return torch.stack(out).float()


def fastest_int8(openvino: OpenVinoModel, dtype: torch.dtype, samples: list[torch.Tensor],
                 reference: torch.Tensor) -> tuple[str | None, dict]:
    """OpenVINO's int8 peer for a run on base `dtype`: both forms (int8_precisions) on `samples`, one per call, each
    compiled by an untimed call, then timed once and its top-1 held to the one quantized bound against `reference`
    (transformers' float32 logits [B, V]). (The faster form that passes, None when neither does: an int8 form outside
    the bound computes something else and is not compared with; {form: {"ms", "check"}} for both.)"""
    report = {}
    for precision in int8_precisions(dtype):
        openvino.logits(precision, samples[:2], 1)
        (seconds, logits), = interleaved_round({precision: lambda p=precision: openvino.logits(p, samples, 1)}).values()
        logprobs = torch.log_softmax(logits, dim=-1)
        ids = logprobs.argmax(-1)
        check = parity.quantized_check(f"openvino_{precision}_top1_vs_fp32", ids,
                                       logprobs.gather(1, ids[:, None])[:, 0], reference)
        report[precision] = {"ms": round(1e3 * seconds, 1), "check": check}
    passing = [p for p, r in report.items() if r["check"]["ok"]]
    return min(passing, key=lambda p: report[p]["ms"]) if passing else None, report
