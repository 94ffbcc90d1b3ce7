"""bench/epilogue_ab.py: both sides compute the same MLP block (the GEMMs then the pointwise kernels, and the GEMMs
with post-ops), on weights packed as the worker packs them."""

import pytest
import torch
import torch.nn.functional as F

from bench.epilogue_ab import sides


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_both_sides_compute_the_mlp_block_with_its_residual():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(37, 32, generator=generator)
    gate, up, down = torch.randn(48, 32, generator=generator), torch.randn(48, 32, generator=generator), \
        torch.randn(32, 48, generator=generator)
    exact = x + (F.silu(x @ gate.T) * (x @ up.T)) @ down.T
    with torch.inference_mode():
        got = {name: call() for name, call in sides(x, gate, up, down).items()}
    assert set(got) == {"separate", "epilogues"}
    for out in got.values():
        assert (out - exact).abs().max() <= 1e-3 * exact.abs().max()
