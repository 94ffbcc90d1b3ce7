"""POST /v1/embeddings (OpenAI's schema) and GET /v1/models: parsing, and the run through the scoring
path. An input's embedding is the final-norm hidden state at its last token (transformers'
`last_hidden_state[:, -1]`), which the scoring node returns as `hidden` (compile/score/module.py);
inputs are tokenized as given (no prompt template), and their count, tokens, deadline and admission
are the scoring path's. `dimensions` is accepted only as the hidden size: the vectors are not shortened.
"""

from __future__ import annotations

import base64
import calendar
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.api.compat_answers import Embedding, EmbeddingsAnswer, EmbeddingsUsage, ModelCard, ModelList
from gateway.api.compat_types import EmbeddingsRequest
from gateway.api.decoding import BodyDecoder
from gateway.api.reranking import served_model
from gateway.api.score import ScoreSpec
from gateway.errors import ApiError
from gateway.limits import Limits

if TYPE_CHECKING:
    from gateway.wiring import Gateway, Settings


@dataclass(frozen=True)
class EmbeddingsSpec:
    """A validated embeddings request: one text or token id list per input."""

    inputs: list[str | list[int]]
    base64: bool
    """encoding_format "base64": each vector as its float32 little-endian bytes in base64."""
    dimensions: int | None
    model: str | None
    deadline_ms: int | None
    priority: int | None = None
    """The body's priority (None: not given)."""


def _build(body: Any, limits: Limits) -> EmbeddingsSpec:
    given = body.input
    if isinstance(given, str):
        inputs: list[str | list[int]] = [given]
    elif isinstance(given[0], int):
        inputs = [list(given)]
    else:
        inputs = list(given)
    if len(inputs) > limits.max_samples_per_request:
        raise ApiError("too_large", f"$.input holds {len(inputs)} inputs; this deployment takes at most "
                                    f"{limits.max_samples_per_request} per request (nothing was truncated)")
    bound = limits.bounds.max_tokens_per_sample
    for i, item in enumerate(inputs):
        if not isinstance(item, str) and len(item) > bound:
            where = "$.input" if isinstance(given[0], int) else f"$.input[{i}]"
            raise ApiError("too_large", f"{where} holds {len(item)} token ids; the compiled bound is {bound} per "
                                        "input (nothing was truncated)")
    return EmbeddingsSpec(inputs, body.encoding_format == "base64", body.dimensions, body.model, body.deadline_ms,
                          body.priority)


DECODER = BodyDecoder(EmbeddingsRequest, _build)


def parse_embeddings(raw: bytes, limits: Limits) -> EmbeddingsSpec:
    """Decode a /v1/embeddings body; raises ApiError (400/404/413) naming the field."""
    if not limits.score_enabled:
        raise ApiError("not_found", "this deployment serves no scoring (score.enabled is false in its config, or its "
                                    "artifacts hold no score node), so no embeddings")
    return DECODER.decode(raw, limits)


async def embed(gateway: Gateway, spec: EmbeddingsSpec, wire_id: str, deadline: float,
                priority: int = 0) -> EmbeddingsAnswer:
    model = served_model(gateway, spec.model)
    hidden_size = gateway.settings.manifest.model.hidden_size
    if spec.dimensions is not None and hidden_size and spec.dimensions != hidden_size:
        raise _dimensions(spec.dimensions, hidden_size)
    answer = await gateway.scoring.score(ScoreSpec(spec.inputs, None, [], "embedding", 0, spec.deadline_ms,
                                                   "boundserve"), wire_id, deadline, priority=priority)
    vectors = np.ascontiguousarray(answer.embeddings, dtype="<f4")
    if spec.dimensions is not None and spec.dimensions != vectors.shape[1]:  # a manifest that does not say
        raise _dimensions(spec.dimensions, vectors.shape[1])
    data = [Embedding(index=i, embedding=base64.b64encode(row.tobytes()).decode() if spec.base64 else row.tolist())
            for i, row in enumerate(vectors)]
    tokens = answer.usage.prompt_tokens
    return EmbeddingsAnswer(data=data, model=model, usage=EmbeddingsUsage(tokens, tokens))


def _dimensions(asked: int, hidden_size: int) -> ApiError:
    return ApiError("invalid_request", f"$.dimensions = {asked}: this model's embeddings have {hidden_size} dimensions "
                                       f"(its hidden size) and are not shortened; leave dimensions out or send "
                                       f"{hidden_size}")


def model_list(settings: Settings) -> ModelList:
    """GET /v1/models: the one served model, under the config's name, created when its artifacts were built."""
    built = settings.manifest.built_at
    try:
        created = calendar.timegm(time.strptime(built, "%Y-%m-%dT%H:%M:%SZ")) if built else 0
    except ValueError:
        created = 0
    return ModelList(data=[ModelCard(id=settings.config.name, created=created)])
