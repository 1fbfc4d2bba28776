"""mhla.torch layers: shapes, agreement with the spec inside the layer, training,
the mixing matrix's constraints, causality, and module plumbing."""
import copy

import pytest
import torch

import mhla
import mhla.torch as mt
from mhla._torch_forms import naive as ref


def make_layers(**options):
    return [
        mt.MHLA1d(24, 3, block_size=4, max_tokens=30, **options),
        mt.MHLA1d(24, 3, block_size=4, max_tokens=30, causal=True, **options),
        mt.MHLA2d(24, 3, grid=(5, 7), tile=(2, 3), **options),  # non-square, not divisible
        mt.MHLA3d(24, 3, grid=(3, 4, 5), tile=(2, 2, 2), **options),
    ]


def tokens_for(layer):
    return 30 if isinstance(layer, mt.MHLA1d) else layer.layout.num_tokens


ALL_OPTIONS = dict(qk_norm=True, gate=True, pos_conv=3, per_head_mixing=True)


class SpecAttention:
    """Replaces a layer's attention step with the spec written in plain torch."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, q, k, v, w, layout):
        return ref.mhla_attention(q, k, v, w, layout, masking=self.layer.masking,
                                  feature_map=self.layer.feature_map)


@pytest.mark.parametrize("options", [{}, ALL_OPTIONS], ids=["plain", "all-options"])
def test_layers_match_the_spec_forward_and_backward(options):
    torch.manual_seed(0)
    for layer in make_layers(**options):
        layer = layer.double()
        x = torch.randn(2, tokens_for(layer), 24, dtype=torch.float64)
        spec_layer = copy.deepcopy(layer)
        spec_layer.attend = SpecAttention(spec_layer)
        y, y_spec = layer(x), spec_layer(x)
        assert y.shape == x.shape
        torch.testing.assert_close(y, y_spec, rtol=1e-10, atol=1e-10)
        y.square().sum().backward()
        y_spec.square().sum().backward()
        for (name, p), p_spec in zip(layer.named_parameters(), spec_layer.parameters()):
            torch.testing.assert_close(p.grad, p_spec.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_layer_gradcheck_through_mixing_and_projections():
    torch.manual_seed(0)
    layer = mt.MHLA2d(6, 2, grid=(3, 4), tile=(2, 2), qk_norm=True, gate=True, pos_conv=3).double()
    x = torch.randn(1, 12, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize("index", range(4))
def test_training_lowers_the_loss_and_keeps_mixing_valid(index):
    torch.manual_seed(index)
    layer = make_layers(**ALL_OPTIONS)[index]
    teacher = make_layers(**ALL_OPTIONS)[index]
    x = torch.randn(4, tokens_for(layer), 24)
    with torch.no_grad():
        target = teacher(x)
    optimiser = torch.optim.AdamW(layer.parameters(), lr=3e-2)
    losses = []
    for _ in range(40):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x), target)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    w = layer.mixing()
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert not torch.allclose(layer.mixing.logits, teacher.mixing.logits)  # the mixing did learn


def test_mixing_stays_valid_under_huge_steps():
    mixing = mt.MixingMatrix(mhla.Layout.sequence(40, 8), heads=3, causal=True)
    optimiser = torch.optim.SGD(mixing.parameters(), lr=1e4)
    for step in range(5):
        optimiser.zero_grad()
        (mixing() * torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimiser.step()
    w = mixing()
    assert torch.isfinite(w).all() and torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 5))
    assert torch.all(w.triu(1) == 0)  # causal: no reading from later blocks


def test_mixing_starts_at_the_locality_init():
    layout = mhla.Layout.grid2d(6, 6, 2, 2)
    w0 = torch.from_numpy(mhla.init_mixing(layout, transform="gaussian"))
    mixing = mt.MixingMatrix(layout, init="gaussian")
    torch.testing.assert_close(mixing(), w0, rtol=0, atol=1e-3)
    assert torch.equal(mixing().argmax(-1), torch.arange(9))  # each block reads itself most


def test_causal_1d_layer_is_causal_and_accepts_shorter_sequences():
    torch.manual_seed(0)
    layer = mt.MHLA1d(16, 2, block_size=4, max_tokens=32, causal=True, pos_conv=5, qk_norm=True)
    x = torch.randn(1, 32, 16)
    full = layer(x)
    for n in [1, 5, 8, 19]:
        torch.testing.assert_close(layer(x[:, :n]), full[:, :n], rtol=1e-5, atol=1e-6)
    changed = x.clone()
    changed[:, 20:] += 1
    torch.testing.assert_close(layer(changed)[:, :20], full[:, :20], rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_and_deepcopy():
    torch.manual_seed(0)
    a = mt.MHLA3d(8, 2, grid=(2, 3, 3), tile=(1, 2, 2), **ALL_OPTIONS)
    b = mt.MHLA3d(8, 2, grid=(2, 3, 3), tile=(1, 2, 2), **ALL_OPTIONS)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 18, 8)
    torch.testing.assert_close(a(x), b(x))
    torch.testing.assert_close(copy.deepcopy(a)(x), a(x))


def test_swapping_attention_in_a_model():
    """The README's example: a block whose attention is an mhla.torch layer."""

    class Block(torch.nn.Module):
        def __init__(self, dim, heads, grid):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.attn = mt.MHLA2d(dim, heads, grid=grid, tile=(7, 7), pos_conv=3)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                           torch.nn.Linear(4 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    block = Block(32, 4, grid=(14, 14))
    y = block(torch.randn(2, 196, 32))
    y.sum().backward()
    assert y.shape == (2, 196, 32) and block.attn.mixing.logits.grad is not None


def test_readme_and_docs_python_examples_run():
    import importlib.util
    import os
    import pathlib
    import re
    import tempfile

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme.split("## Using it from Python and PyTorch\n")[1].split("\n## ")[0]
    docs = "".join((root / "docs" / page).read_text()
                   for page in ("python.md", "timm.md", "transformers.md", "diffusers.md"))
    blocks = re.findall(r"```python\n(.*?)```", section + docs, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        # The torch.compile, timm, transformers and diffusers examples need torch 2.x and those packages.
        optional = [package for package in ("timm", "transformers", "diffusers")
                    if re.search(rf"\b(import|from) (mhla\.)?{package}\b", block)]
        if ("torch.compile" in block and not hasattr(torch, "compile")) or \
                any(importlib.util.find_spec(package) is None for package in optional):
            continue
        namespace = {}
        with tempfile.TemporaryDirectory() as scratch:  # what an example saves lands here
            previous = os.getcwd()
            os.chdir(scratch)
            try:
                exec(compile(block, "README.md", "exec"), namespace)
            finally:
                os.chdir(previous)
        if "Block" in namespace:
            x = torch.randn(2, 196, 192)
            assert namespace["Block"]()(x).shape == x.shape
