"""Weights the worker prepacks once at load into their GEMM kernel's layout, shared by every node.

A CPU package is compiled with ordinary dense [out, in] weight constants and calls oneDNN's matmul on
them (`mkldnn::_linear_pointwise`, compile/linear.py). Handed a packed tensor instead, through
`load_constants(user_managed=True)`, the package passes it to the same op unchanged (the runtime
stores the handle; the op reads oneDNN's own blocked layout), so the kernel no longer re-blocks the
weight on every call. The weights file stays dense (portable, hashed); packing happens at load,
once, and both nodes get the same packed tensors. oneDNN's blocked layout does not depend on the
row count it is packed for (AB16b64a float32 / AB16b64a2b bfloat16 at 100, 400 and 4,285 rows), so
one copy serves the scoring node's thousands of tokens and the beam node's hundred-row steps.
Measured per GEMM at Qwen2.5-0.5B's shapes (1 thread, CPU time): +4-9 % at 4,285 rows, up to +14 %
at 100 rows.

That is only sound for a constant the graph uses *whole, as the weight of such an op*: a slice or a
view of it would read the blocked bytes as if they were dense (silently wrong). `packable` reads it
off each exported program; a constant is packed only if every node that uses it uses it that way
(the pruned last layer's q / k,v slices of the fused q/k/v weight and the tied embedding stay dense).
int8 weights (compile/quantize/int8.py quantizes it) are packed the same way, into oneDNN's VNNI layout. The build records
the packed names in the manifest (`prepacked`).
"""

from __future__ import annotations

import torch

ONEDNN = "onednn"
ONEDNN_INT8 = "onednn_int8"

# op -> (position of its weight argument, the packing it takes)
_WEIGHT_ARG = {torch.ops.mkldnn._linear_pointwise.default: (1, ONEDNN),
               torch.ops.mkldnn._linear_pointwise.binary: (2, ONEDNN),  # a GEMM with a binary post-op (x, other, W)
               torch.ops.onednn.qlinear_pointwise.tensor: (3, ONEDNN_INT8)}


def packable(program: torch.export.ExportedProgram) -> dict[str, str | None]:
    """Every parameter / buffer FQN of the program -> its packing, or None where some use is not a whole weight."""
    signature = program.graph_signature
    fqn_of = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    result: dict[str, str | None] = {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in fqn_of:
            continue
        kinds = {_whole_weight_of(user, node) for user in node.users}
        result[fqn_of[node.name]] = kinds.pop() if len(kinds) == 1 else None
    return result


def _whole_weight_of(user: torch.fx.Node, node: torch.fx.Node) -> str | None:
    """The packing `user` takes `node` with, when it reads node only as its whole weight; else None."""
    position, kind = _WEIGHT_ARG.get(user.target, (None, None))
    if position is None or user.args[position] is not node or sum(a is node for a in user.args) != 1:
        return None
    return kind


def combine(per_node: list[dict[str, str | None]]) -> dict[str, str]:
    """The constants that every node using them can take packed, with their packing (sorted by name)."""
    verdict: dict[str, str | None] = {}
    for node in per_node:
        for name, kind in node.items():
            verdict[name] = kind if verdict.get(name, kind) == kind else None
    return {name: kind for name, kind in sorted(verdict.items()) if kind is not None}


def pack(weights: dict[str, torch.Tensor], packing: dict[str, str]) -> dict[str, torch.Tensor]:
    """The weights with every named constant replaced by its packed form (the dense copy is dropped)."""
    out = dict(weights)
    for name, kind in packing.items():
        if kind == ONEDNN:
            out[name] = torch.ops.mkldnn._reorder_linear_weight(weights[name], 1024)  # the layout ignores the hint
        elif kind == ONEDNN_INT8:
            out[name] = pack_int8(weights[name])  # the dense [K, N] int8 weight (compile/quantize/int8.py quantizes it)
        else:
            raise ValueError(f"manifest: unknown packing {kind!r} for weight {name}; rebuild the artifacts")
    return out


def pack_int8(qweight: torch.Tensor) -> torch.Tensor:
    """The dense [K, N] int8 weight -> oneDNN's packed layout. qlinear_prepack reads memory order and ignores
    strides, so its [N, K] operand is made contiguous first (a transposed view packs garbage, silently)."""
    return torch.ops.onednn.qlinear_prepack(qweight.t().contiguous(), None)
