"""The measured table of where a CUDA call runs (python/mhla/_cuda_dispatch.py): how the plan reads
it, and how bench/gpu_check.py writes it from its measurements. Without a GPU, a stand-in for a CUDA
tensor carries what the plan reads (device, dtype, shape)."""
import importlib.util
import os

import pytest
import torch

from mhla import _cuda_dispatch, _plan

ROWS = (
    dict(dtype="bfloat16", masking="none", needs_grad=True, long_sequence=False, wide_heads=False,
         path="cpp", cuda_kernels=("bf16_state",)),
    dict(dtype="bfloat16", masking="none", needs_grad=True, long_sequence=True, wide_heads=False,
         path="cpp", cuda_kernels=()),
    dict(dtype="bfloat16", masking="none", needs_grad=True, long_sequence=False, wide_heads=True,
         path="cpp", cuda_kernels=()),
)


class CudaStandIn:
    """What the plan reads of a CUDA tensor [B, N, H, D]."""

    def __init__(self, tokens, dim, dtype=torch.bfloat16):
        self.device, self.dtype, self.shape = torch.device("cuda"), dtype, (1, tokens, 8, dim)

    def dim(self):
        return 4


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(_cuda_dispatch, "ROWS", ROWS)
    monkeypatch.setattr(_plan._core, "has_cuda_backend", True)


def test_the_first_row_covering_a_call_chooses_its_path_and_kernels():
    bits = _plan.cuda_kernel_bits
    assert _plan.measured_choice(torch.bfloat16, "none", 4096, 64, True, ROWS) == ("cpp", bits(["bf16_state"]))
    assert _plan.measured_choice(torch.bfloat16, "none", 65536, 64, True, ROWS) == ("cpp", 0)
    assert _plan.measured_choice(torch.bfloat16, "none", 4096, 128, True, ROWS) == ("cpp", 0)
    for call in ((torch.float16, "none", 4096, 64, True), (torch.bfloat16, "causal", 4096, 64, True),
                 (torch.bfloat16, "none", 4096, 64, False), (torch.bfloat16, "none", 4096, 256, True),
                 (torch.bfloat16, "none", 65536, 128, True)):
        assert _plan.measured_choice(*call, ROWS) is None, call


def test_a_cuda_call_that_names_nothing_follows_the_table(table):
    q = CudaStandIn(4096, 64)
    plan = _plan.plan("mhla", (q,), needs_grad=True)
    assert (plan.path, plan.cuda_kernels) == ("cpp", _plan.cuda_kernel_bits(["bf16_state"]))
    assert not plan.keeps_state  # the bfloat16-state kernels recompute their state
    # What the call names, the table does not change; nor calls no row covers.
    assert _plan.plan("mhla", (q,), backend="torch", needs_grad=True).path == "torch"
    assert _plan.plan("mhla", (q,), cuda_kernels=0, needs_grad=True)[:2] == ("torch", 0)
    assert _plan.plan("mhla", (q,), needs_grad=False)[:2] == ("torch", 0)
    assert _plan.plan("mhla", (q,), needs_grad=True, masking="causal")[:2] == ("torch", 0)
    assert _plan.plan("linear", (q,), needs_grad=True)[:2] == ("torch", 0)


def test_without_rows_cuda_calls_take_the_plain_torch_path(monkeypatch):
    monkeypatch.setattr(_plan._core, "has_cuda_backend", True)
    assert _cuda_dispatch.ROWS == ()  # no GPU has measured the families yet
    assert _plan.plan("mhla", (CudaStandIn(4096, 64),), needs_grad=True)[:2] == ("torch", 0)


def gpu_check():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu_check.py")
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_checks_comparison_of_every_family_runs_on_cpu_tensors():
    # On the CPU every family is the C++ operator or the torch path (CUDA kernel families are
    # ignored there): each must pass against float64; the timings are stubbed.
    import mhla
    check = gpu_check()
    rows = check.check_families("small", 40, 2, 8, mhla.Layout.sequence(40, 8), "causal", device="cpu",
                                timer=lambda attend, inputs: (1.0, 2.0))
    assert len(rows) == len(check.FAMILIES)
    assert all(r["passed"] and len(r["errors"]) == 5 and r["fwd_ms"] == 1.0 for r in rows), rows
    assert max(r["errors"][0] for r in rows if r["dtype"] == "float32") < 1e-5


def measured(family, tokens, fwd, fwdbwd, passed=True, kernels=()):
    return dict(family=family, dtype="bfloat16", masking="none", tokens=tokens, head_dim=64, fwd_ms=fwd,
                fwdbwd_ms=fwdbwd, passed=passed, cuda_kernels=list(kernels))


def test_the_gpu_check_writes_the_fastest_passing_family_where_it_beats_the_torch_path(tmp_path):
    check = gpu_check()
    families = [
        measured("torch", 4096, 0.30, 1.00), measured("split_operand", 4096, 0.20, 1.20),
        measured("bf16_state", 4096, 0.10, 0.50, kernels=["bf16_state"]),
        measured("torch", 65536, 1.0, 3.0), measured("split_operand", 65536, 0.9, 4.0),
        measured("bf16_state", 65536, 0.5, 2.0, passed=False, kernels=["bf16_state"]),
    ]
    rows = check.dispatch_rows(families)
    assert [(r["long_sequence"], r["needs_grad"], r["family"]) for r in rows] == [
        (False, False, "bf16_state"),      # 4,096 tokens: the fastest passing family
        (False, True, "bf16_state"),
        (True, False, "split_operand"),    # 65,536 tokens, inference: bf16_state failed, split 0.9 < 1.0
    ]  # 65,536 tokens, training: split_operand is slower than the torch path, so no row
    # The module it writes is what the plan reads.
    module = tmp_path / "_cuda_dispatch.py"
    module.write_text(check.dispatch_module("a card", rows))
    spec = importlib.util.spec_from_file_location("written", module)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    assert written.DEVICE == "a card" and len(written.ROWS) == 3
    assert _plan.measured_choice(torch.bfloat16, "none", 4096, 64, True, written.ROWS) == (
        "cpp", _plan.cuda_kernel_bits(["bf16_state"]))
