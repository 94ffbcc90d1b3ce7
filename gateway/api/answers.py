"""The HTTP answers, declared once as msgspec Structs: the services build them, `encode_json` writes
them, and /openapi.json describes them (gateway/api/openapi.py). Errors: gateway/errors.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import UNSET, Meta, Struct, UnsetType

from gateway.api.types import OUTPUTS

# Numeric fields hold the numpy arrays the services computed; `encode_json` writes them as JSON
# lists (a value that is not finite, e.g. a log-probability of -inf, as null).
Matrix = Annotated[list[list[float | None]], Meta(description="One row per sample; null where not finite.")]


class TokenDetails(Struct):
    """As OpenAI's prompt_tokens_details: prompt tokens whose keys/values were reused, not computed."""

    cached_tokens: int


class ScoreUsage(Struct):
    """Tokens submitted (every sample whole) and those reused by a shared prefix."""

    samples: int
    prompt_tokens: int
    prompt_tokens_details: TokenDetails


class TopK(Struct):
    """The top_k most likely next tokens of each sample."""

    token_ids: list[list[int]]
    logprobs: Matrix
    tokens: list[list[str]]


class ScoreAnswer(Struct, kw_only=True):
    """The answer to boundserve's /v1/score shape; the fields present follow `output`."""

    id: str
    object: Literal["score"] = "score"
    output: Literal[OUTPUTS]
    usage: ScoreUsage
    label_token_ids: list[int] | UnsetType = UNSET
    scores: Matrix | UnsetType = UNSET
    topk: TopK | UnsetType = UNSET
    embeddings: Matrix | UnsetType = UNSET
    head: Matrix | UnsetType = UNSET


class SglangUsage(Struct):
    """SGLang's usage: prompt tokens; scoring completes none."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: TokenDetails


class SglangScoreAnswer(Struct, kw_only=True):
    """The answer to SGLang's /v1/score shape: per item, per label, a probability."""

    scores: Matrix
    model: str
    usage: SglangUsage
    object: Literal["scoring"] = "scoring"


class Candidate(Struct):
    """One returned beam: its text, its new token ids and its score, the sum of its new tokens'
    log-probabilities divided by their count raised to the checkpoint's length_penalty (its
    generation_config; 1.0, the default: the mean log-probability per new token), as transformers'
    beam search ranks them."""

    text: str
    token_ids: list[int]
    score: float


class GenerateUsage(Struct):
    prompt_tokens: int
    completion_tokens: int


class GenerateAnswer(Struct, kw_only=True):
    """The answer to /v1/generate: the best candidates, best first."""

    id: str
    object: Literal["generation"] = "generation"
    candidates: list[Candidate]
    usage: GenerateUsage
    catalog_version: int | None = None
    """Constrained decoding: the version of the worker's catalogues that served it (POST /admin/constraints
    and the watched [beam] constraints file make new ones); null: unconstrained."""


class Health(Struct):
    """GET /healthz: the process is alive."""

    status: Literal["ok"] = "ok"


class WorkerState(Struct, omit_defaults=True):
    endpoint: str
    state: str
    pid: int | None
    workloads: list[str]
    in_flight_batches: int
    refused: str | None = None
    """Why this gateway does not serve the worker though it answered (its bounds differ from the gateway's)."""


class Ready(Struct, kw_only=True):
    """GET /readyz: at least one worker is ready."""

    status: Literal["ready"] = "ready"
    workers: list[WorkerState]


ANSWERS = (ScoreAnswer, SglangScoreAnswer, GenerateAnswer, Health, Ready)


def _builtin(value: Any) -> Any:
    """numpy arrays and scalars as JSON lists and numbers (msgspec's hook for types it does not know)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise NotImplementedError(f"cannot write a {type(value).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_builtin)


def encode_json(answer: Any) -> bytes:
    return _ENCODER.encode(answer)
