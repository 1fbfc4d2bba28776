"""What one forward and one backward of mhla.torch's plain-torch path launch, counted on the CPU
(a GPU runs one kernel per such op): the ops that compute (views and metadata not counted,
copies counted), how many of them only the finite-result checks use (``_foreach_norm``, and the
``cat`` of the deferred check a GPU runs, "deferred"; on a GPU its copy to the host is one op
more, here a copy of w is), and the bytes their tensors read and write (an ``out=`` tensor and a
copy's destination written only) over the floor (q, k, v and o once each; the backward's: q, k,
v, o, grad_o read, grad_q, grad_k, grad_v written), beside the einsum formulation, at
bench/gpu_check.py's four shapes in float32.

    PYTHONPATH=build/python python3 bench/torch_op_count.py [--json FILE]

The targets of the path: forward at most 15 ops and 3x the floor's bytes, backward at most 30
ops and 8x. 3x is the least any form of unfused ops reaches: q and k read and phi written (one
op for both, at best), v regrouped, the three products' reads and writes, o written: 12 passes
over tensors of q's size against the floor's 4.
"""
import argparse
import collections
import json
import os
import sys
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mhla
import mhla.torch as mt
from mhla import _finite_results
from mhla._torch_forms.einsum import einsum_mhla

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import SHAPES  # noqa: E402

# Ops that only describe memory (views, shape queries): no kernel runs for them.
_FREE = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze",
         "select", "slice", "as_strided", "alias", "detach", "unflatten", "flatten", "split", "chunk",
         "unbind", "diagonal", "narrow", "view_as", "lift_fresh", "_reshape_alias", "split_with_sizes",
         "_local_scalar_dense", "is_same_size", "empty", "empty_like", "new_empty", "new_empty_strided",
         "empty_strided", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size",
         "stride", "numel", "is_contiguous", "_to_copy_noop", "is_pinned"}
# The finite-result checks' ops (python/mhla/_finite_results.py).
_CHECKS = {"_foreach_norm", "cat"}


def _bytes(x):
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


# Ops that overwrite their first argument without reading it (every other in-place op reads it
# as well).
_OVERWRITE = {"copy", "fill", "zero"}


def _read(name, args, kwargs):
    """The arguments an op reads: all but an ``out=`` tensor and an overwritten first argument,
    which it only writes (its output counts them)."""
    kwargs = {key: value for key, value in kwargs.items() if key != "out"}
    return (args[1:] if name in _OVERWRITE else args), kwargs


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.checks = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0].rstrip("_")
        if name in _FREE:
            return out
        self.ops[name] += 1
        self.checks += name in _CHECKS
        flat_in = torch.utils._pytree.tree_leaves(_read(name, args, kwargs))
        flat_out = torch.utils._pytree.tree_leaves(out)
        self.bytes += sum(_bytes(t) for t in flat_in) + sum(_bytes(t) for t in flat_out)
        return out


def measure(forward, q, k, v):
    """One forward and one backward counted, after one uncounted (a model's calls after its first:
    the masks a layout needs are made once and kept), with the finite check a GPU runs (one
    ``_foreach_norm`` a group, where the CPU takes each tensor's ``aminmax``)."""
    forward(*(t.detach().requires_grad_() for t in (q, k, v))).sum().backward()
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with mock.patch.object(_finite_results, "_uses_norms", lambda device: True):
        with Count() as f:
            o = forward(q, k, v)
        grad = torch.randn_like(o)
        with Count() as b:
            o.backward(grad)
    floor_f = sum(_bytes(t) for t in (q, k, v, o))
    floor_b = sum(_bytes(t) for t in (q, k, v, o, grad)) + sum(_bytes(t) for t in (q, k, v))
    return dict(forward_ops=sum(f.ops.values()), forward_checks=f.checks, forward_bytes_x=f.bytes / floor_f,
                backward_ops=sum(b.ops.values()), backward_checks=b.checks, backward_bytes_x=b.bytes / floor_b,
                forward_op_list=dict(f.ops), backward_op_list=dict(b.ops))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--ops", action="store_true", help="list each op and its count")
    args = parser.parse_args()
    rows = []
    for name, tokens, heads, dim, layout, masking in SHAPES:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(3))
        w = torch.as_tensor(mhla.init_mixing(layout, causal=masking == "causal"))
        row = dict(shape=name)
        def torch_path(q, k, v):
            return mt.mhla_attention(q, k, v, w, layout, masking=masking, backend="torch")

        row["mhla.torch"] = measure(torch_path, q, k, v)
        previous = mt.set_finite_check("deferred")  # a GPU's check, answered here at once
        row["mhla.torch deferred"] = measure(torch_path, q, k, v)
        mt.set_finite_check(previous)
        if masking == "none":
            block = tokens // layout.num_blocks
            row["einsum"] = measure(lambda q, k, v: einsum_mhla(q, k, v, w, block), q, k, v)
        rows.append(row)
        for label in ("mhla.torch", "mhla.torch deferred", "einsum"):
            if label not in row:
                continue
            r = row[label]
            print(f"{name:40} {label:19} forward {r['forward_ops']:3} ops ({r['forward_checks']:2} checks) "
                  f"{r['forward_bytes_x']:5.1f}x floor   backward {r['backward_ops']:3} ops "
                  f"({r['backward_checks']:2} checks) {r['backward_bytes_x']:5.1f}x floor")
            if args.ops:
                print("    forward: ", dict(sorted(r["forward_op_list"].items())))
                print("    backward:", dict(sorted(r["backward_op_list"].items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
