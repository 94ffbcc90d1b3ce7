"""transformers' beam search (and greedy search for W = 1), one prompt at a time, as the reference."""

from __future__ import annotations

import torch

from shared.bounds import Bounds


def beam_bounds(max_beams: int, max_steps: int) -> Bounds:
    """The bounds an eager beam node is built for in these tests (prompts up to 64 tokens, 4 per batch)."""
    return Bounds(max_beam_width=max_beams, max_new_tokens=max_steps, max_prompt_tokens=64,
                  max_beam_requests_per_batch=4).resolved()


def hf_beam(hf_model, prompt: torch.Tensor, num_beams: int, steps: int, k: int, eos_ids, length_penalty: float,
            **generate_kwargs):
    """-> tokens [k, steps] (fill after the end), scores [k], lengths [k] (new tokens incl. EOS)."""
    with torch.inference_mode():
        out = hf_model.generate(
            prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=num_beams,
            num_return_sequences=k, max_new_tokens=steps, do_sample=False, return_dict_in_generate=True,
            output_scores=True, **generate_kwargs,
        )
    new = out.sequences[:, len(prompt):]
    lengths = torch.full((k,), new.shape[1], dtype=torch.int64)
    for j in range(k):
        ends = [i for i, t in enumerate(new[j].tolist()) if t in eos_ids]
        if ends:
            lengths[j] = ends[0] + 1
    if num_beams > 1:
        return new, out.sequences_scores.float(), lengths
    # greedy: the score is the summed log-prob of the kept tokens, length-penalised like a beam
    logprobs = torch.stack([torch.log_softmax(s.float(), -1)[0] for s in out.scores])  # [steps, V]
    n = int(lengths[0])
    total = logprobs[torch.arange(n), new[0, :n]].sum()
    return new, (total / n ** length_penalty)[None], lengths


def assert_same_as_hf(ours, request: int, reference, score_atol: float = 1e-4) -> None:
    """Same candidates in the same order (tokens up to each end), same lengths, same scores."""
    tokens, scores, lengths = reference
    k = len(scores)
    assert ours.lengths[request].tolist() == lengths.tolist(), (ours.lengths[request], lengths)
    for j in range(k):
        n = int(lengths[j])
        assert ours.sequences[request, j, :n].tolist() == tokens[j, :n].tolist(), (request, j)
    torch.testing.assert_close(ours.scores[request], scores, atol=score_atol, rtol=0)
