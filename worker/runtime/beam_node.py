"""BeamNode: the worker-side face of the beam-search node (compiled package or eager module).

Checks a request against the compiled bounds (shared/bounds.py's rules), lays out the node's inputs
(positions, prompt boundaries, the per-request prompt index) and cuts the outputs down to what was asked:
k = num_return_sequences candidates of max_new_tokens tokens, pad after each candidate's end.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from worker.runtime.layout import CPU_BLOCK, padded
from worker.runtime.machine import check_threads
from worker.runtime.transfer import Pending, Staging
from shared.bounds import BeamShape, Bounds, BoundsError, beam_problem, outside_vocabulary
from shared.manifest import Manifest


NO_CANDIDATE = -1.0e8  # scores at or below this are transformers' "impossible" (-1e9 or -inf)


class BeamOutput(NamedTuple):
    """Per request the best k candidates, best first; a slot with length 0 and score -inf is empty
    (constrained decoding found fewer than k valid sequences)."""

    sequences: torch.Tensor  # [R, k, S] int64 new tokens only, pad id after a candidate's end
    scores: torch.Tensor  # [R, k] float32 cumulative log-prob / length ** length_penalty
    lengths: torch.Tensor  # [R, k] int64 new tokens per candidate (EOS included)


def node_inputs(prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, num_beams: int, num_steps: int,
                early_stopping_all: bool, block: int) -> tuple[torch.Tensor, ...]:
    """The exported node's eight inputs (see compile/beam/module.py) for one batch of prompts, the
    packed tokens padded to a multiple of the attention block (padding rows after the last prompt)."""
    lens = prompt_lens.to(torch.int64)
    cu = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lens, 0)
    starts = cu[:-1]
    positions = torch.arange(prompt_ids.numel()) - torch.repeat_interleave(starts, lens)  # [T]
    longest = int(lens.max())
    offsets = torch.arange(longest)[None, :]  # [1, L]
    valid = offsets < lens[:, None]  # [R, L]
    index = torch.where(valid, starts[:, None] + offsets, torch.zeros_like(offsets))  # [R, L]
    filler = padded(prompt_ids.numel(), block) - prompt_ids.numel()
    ids = torch.cat([prompt_ids.to(torch.int64), torch.zeros(filler, dtype=torch.int64)])  # [T']
    positions = torch.cat([positions, torch.zeros(filler, dtype=torch.int64)])
    return (
        ids, positions, cu.to(torch.int32), index, valid,
        torch.zeros(num_beams, dtype=torch.int64), torch.tensor(num_steps, dtype=torch.int64),
        torch.tensor(bool(early_stopping_all)),
    )


class BeamNode:
    """Run beam search for a batch of prompts: __call__(prompt_ids, prompt_lens, W, S, k) -> BeamOutput."""

    def __init__(self, run: Callable, bounds: Bounds, vocab_size: int, early_stopping: bool | str, pad_id: int,
                 device: str = "cpu", block: int = CPU_BLOCK, threads: int | None = None, constrained: bool = False):
        self._run = run  # the loaded AOTI package (or the eager BeamModule)
        self.constrained = constrained  # takes a catalogue with every call (compile/beam/module.py)
        self.block = block  # the package's attention block: the packed prompts are padded to it
        self.threads = threads  # the CPU threads the package was compiled for (None: unchecked)
        self.bounds = bounds
        self.vocab_size = vocab_size
        self.early_stopping = early_stopping
        self.pad_id = pad_id
        self.device = torch.device(device)

    @classmethod
    def from_package(cls, package: Callable, manifest: Manifest, device: str) -> "BeamNode":
        """The node worker/runtime/loader.py builds for a loaded beam package."""
        facts = manifest.node_table().beam
        threads = manifest.cpu_threads if torch.device(device).type == "cpu" else None
        return cls(package, manifest.bounds, manifest.model.vocab_size, facts.early_stopping, facts.pad_id, device,
                   facts.attention_block, threads, facts.constrained)

    def __call__(self, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, num_beams: int, max_new_tokens: int,
                 num_return_sequences: int, catalog: tuple[torch.Tensor, ...] | None = None) -> BeamOutput:
        return self.launch(prompt_ids, prompt_lens, num_beams, max_new_tokens, num_return_sequences,
                           catalog=catalog).result()

    def launch(self, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, num_beams: int, max_new_tokens: int,
               num_return_sequences: int, staging: Staging | None = None,
               catalog: tuple[torch.Tensor, ...] | None = None) -> Pending:
        """Enqueue the call (see worker/runtime/transfer.py); Pending.result() builds the BeamOutput. A
        constrained node takes `catalog`: each request's root row [R] int64 (host), then the five tables,
        already on the node's device (worker/catalog_store.py's Catalog.node_inputs)."""
        self.check(prompt_ids, prompt_lens, num_beams, max_new_tokens, num_return_sequences)
        self.check_catalog(catalog, prompt_lens.numel())
        check_threads(self.threads, torch.get_num_threads())
        early_all = self.early_stopping is True or num_beams == 1
        args = node_inputs(prompt_ids, prompt_lens, num_beams, max_new_tokens, early_all, self.block)
        staging = staging or Staging(str(self.device))
        tables = ()
        if catalog is not None:
            args, tables = (*args, catalog[0].to(torch.int64)), catalog[1:]
        with torch.inference_mode():
            outputs = self._run(*staging.to_device(args), *tables)
            return staging.to_host(list(outputs), lambda host: self._output(host, num_return_sequences, max_new_tokens))

    def _output(self, outputs: list[torch.Tensor], k: int, s: int) -> BeamOutput:
        tokens, scores, lens = outputs
        tokens, scores, lens = tokens[:, :k, :s], scores[:, :k].float(), lens[:, :k]
        # Fewer than k candidates exist (constrained decoding with a small valid set): empty slots.
        missing = scores <= NO_CANDIDATE
        scores, lens = scores.masked_fill(missing, float("-inf")), lens.masked_fill(missing, 0)
        after_end = torch.arange(s)[None, None, :] >= lens[:, :, None]
        return BeamOutput(tokens.masked_fill(after_end, self.pad_id), scores, lens)

    def check_catalog(self, catalog: tuple[torch.Tensor, ...] | None, num_requests: int) -> None:
        """A constrained node needs a catalogue with one root per request; an unconstrained one takes none."""
        if self.constrained and catalog is None:
            raise BoundsError("this beam node decodes constrained: it needs a catalogue (none is loaded)")
        if not self.constrained and catalog is not None:
            raise BoundsError("this beam node was built without catalogue tables ([beam] max_catalog_nodes = 0)")
        if catalog is not None and catalog[0].shape != (num_requests,):
            raise BoundsError(f"the catalogue roots have shape {list(catalog[0].shape)}, not one per request "
                              f"({num_requests})")

    def check(self, prompt_ids, prompt_lens, num_beams, max_new_tokens, num_return_sequences) -> None:
        """Raise BoundsError naming the first bound (shared/bounds.py) or consistency rule the request breaks."""
        if prompt_ids.dim() != 1 or prompt_lens.dim() != 1:
            raise BoundsError("prompt_ids and prompt_lens must be 1-D tensors")
        if prompt_lens.numel() < 1 or int(prompt_lens.min()) < 1:
            raise BoundsError("a batch needs at least one prompt, and every prompt at least one token")
        if num_beams < 1 or max_new_tokens < 1 or not 1 <= num_return_sequences <= num_beams:
            raise BoundsError(f"num_beams = {num_beams} and max_new_tokens = {max_new_tokens} must be >= 1, "
                              f"num_return_sequences = {num_return_sequences} between 1 and num_beams")
        problem = beam_problem(self.bounds, BeamShape(prompt_lens.numel(), int(prompt_lens.max()), num_beams,
                                                      max_new_tokens))
        if problem:
            raise BoundsError(str(problem))
        if int(prompt_lens.sum()) != prompt_ids.numel():
            raise BoundsError(f"prompt_lens sum to {int(prompt_lens.sum())} but prompt_ids has {prompt_ids.numel()}")
        if prompt_ids.numel() and (int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= self.vocab_size):
            raise BoundsError(outside_vocabulary("token id", self.vocab_size))
