"""Results of 1 MiB or more reuse the memory of freed results of the same size
(a fresh allocation is mapped page by page on first write, which cost a third
of a forward pass); mhla.release_memory() hands it back."""
import numpy as np
import torch

import mhla
import mhla.torch as mt


def operands(tokens, heads=4, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=g) for _ in range(3))
    layout = mhla.Layout.sequence(tokens, 64)
    return q, k, v, torch.from_numpy(mhla.init_mixing(layout)), layout


def test_a_freed_result_is_reused_by_the_next_of_its_size():
    mhla.release_memory()
    q, k, v, w, layout = operands(2048)  # o is 2 MiB
    o = mhla.forward(q, k, v, w, layout=layout)
    address = o.data_ptr()
    assert mhla._core.recycled_buffer_bytes() == 0
    del o
    assert mhla._core.recycled_buffer_bytes() >= 2 << 20
    again = mhla.forward(q * 2, k, v, w, layout=layout)
    assert again.data_ptr() == address
    # The reused memory holds the new result, as fresh memory does (the kernels are deterministic).
    want = mhla.forward(q * 2, k, v, w, layout=layout)
    assert want.data_ptr() != address and torch.equal(again, want)
    del again
    mhla.release_memory()
    assert mhla._core.recycled_buffer_bytes() == 0


def test_small_results_are_not_kept():
    mhla.release_memory()
    q, k, v, w, layout = operands(64, heads=1, dim=8)
    del q, k, v
    o = mhla.forward(*(torch.ones(1, 64, 1, 8) for _ in range(3)), w[:1, :1].contiguous(), layout=layout)
    del o
    assert mhla._core.recycled_buffer_bytes() == 0


def test_gradients_through_recycled_memory_match_fresh_memory():
    q, k, v, w, layout = operands(2048, seed=1)

    def gradients():
        leaves = [t.detach().requires_grad_() for t in (q, k, v, w)]
        mt.mhla_attention(*leaves, layout).square().sum().backward()
        return [t.grad.clone() for t in leaves]

    mhla.release_memory()
    fresh = gradients()
    for _ in range(3):  # each step now reuses the previous step's buffers
        assert all(torch.equal(a, b) for a, b in zip(gradients(), fresh))


def test_numpy_results_keep_their_memory_alive():
    q, k, v, w, layout = (np.asarray(x) if isinstance(x, torch.Tensor) else x for x in operands(2048, seed=2))
    o = mhla.forward(q, k, v, w, layout=layout)
    copy = o.copy()
    mhla.release_memory()  # only freed results are released; o is still held
    assert np.array_equal(o, copy)
