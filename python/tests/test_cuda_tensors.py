"""CUDA tensors through DLPack: mhla.forward and mhla.backward hand them to the
library's CUDA backend (results on the inputs' device, the call on the stream
it is given, ordered with the caller's streams); every other entry point, and a build or a machine without
that backend, refuses them by name before reading them.

The tests that need a GPU skip without one; the refusals run everywhere."""
import ctypes
import re

import numpy
import pytest
import torch

import mhla
from mhla import _core

LAYOUT = mhla.Layout.grid2d(5, 6, 2, 4)  # ragged edge tiles: M = 3 x 2
HEADS, DK, DV = 2, 8, 4

gpu = pytest.mark.skipif(
    not (_core.has_cuda_backend and torch.cuda.is_available()),
    reason="needs a CUDA device and an mhla built with its CUDA backend")


def operands(dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n, m = LAYOUT.num_tokens, LAYOUT.num_blocks
    q = torch.randn(2, n, HEADS, DK, generator=g, dtype=dtype)
    k = torch.randn(2, n, HEADS, DK, generator=g, dtype=dtype)
    v = torch.randn(2, n, HEADS, DV, generator=g, dtype=dtype)
    w_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    w = 0.2 + torch.rand(m, m, generator=g, dtype=w_dtype)
    return tuple(x.to(device) for x in (q, k, v, w))


class AnnouncedOnCuda:
    """A tensor that says it is on cuda:`id`; it must be refused before it is exported."""

    def __init__(self, id):
        self.id = id

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be exported")

    def __dlpack_device__(self):
        return (2, self.id)  # kDLCUDA


def refusal_of_a_cuda_operand(name, id):
    """What mhla.forward says of operand `name` on cuda:`id` where it cannot run there."""
    if not _core.has_cuda_backend:
        return f"{name} is on cuda:{id}, but this build of mhla has no CUDA backend"
    return (f"{name} is on cuda:{id}(, but no CUDA device is visible to this process"
            f"| but the current CUDA device is cuda:\\d+; make it current first)")


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="cuda:1 exists here")
def test_an_operand_on_an_unusable_cuda_device_is_refused_before_export():
    q, k, v, w = operands()
    with pytest.raises(ValueError, match=refusal_of_a_cuda_operand("k", 1)):
        mhla.forward(q, AnnouncedOnCuda(1), v, w, layout=LAYOUT)


def test_functions_without_a_cuda_backend_refuse_cuda_tensors_by_name():
    q, k, v, w = operands()
    cpu_only = ("this function of mhla runs on the CPU only" if _core.has_cuda_backend
                else "mhla runs on the CPU")
    with pytest.raises(ValueError, match=f"q is on cuda:0; {cpu_only}"):
        mhla.varlen_forward(AnnouncedOnCuda(0), k[:1], v[:1], w, [0, LAYOUT.num_tokens], block=4)
    with pytest.raises(ValueError, match=f"v is on cuda:0; {cpu_only}"):
        mhla.linear_attention_forward(q, k, AnnouncedOnCuda(0))


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class UnannouncedOnCuda:
    """A DLPack producer without __dlpack_device__ whose capsule says cuda:0. Its
    data address is not readable memory: reading it would crash the test."""

    def __init__(self, shape):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed = DLManagedTensor()
        self.managed.dl_tensor = DLTensor(0x1000, DLDevice(2, 0), len(shape), DLDataType(2, 32, 1),
                                          self.shape, None, 0)

    def __dlpack__(self, stream=None):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is visible: the address would be read")
def test_a_cuda_capsule_from_a_producer_that_did_not_say_so_is_refused_by_name():
    q, k, v, w = operands()
    cuda_v = UnannouncedOnCuda(list(v.shape))
    with pytest.raises(ValueError, match=refusal_of_a_cuda_operand("v", 0)):
        mhla.forward(q, k, cuda_v, w, layout=LAYOUT)
    with pytest.raises(ValueError, match="v is on cuda:0; (this function of )?mhla runs on the CPU"):
        mhla.linear_attention_forward(q, k, cuda_v)


def test_calls_on_cpu_tensors_ignore_the_stream_they_are_given():
    q, k, v, w = operands()
    o = mhla.forward(q, k, v, w, layout=LAYOUT)
    grad_o = torch.randn_like(o)
    want = mhla.backward(q, k, v, w, o, grad_o, layout=LAYOUT)
    on_a_stream = mhla.forward(q, k, v, w, layout=LAYOUT, stream=12345)
    got = mhla.backward(q, k, v, w, o, grad_o, layout=LAYOUT, stream=0)
    assert torch.equal(on_a_stream, o)
    for g, x in zip(got, want):
        assert torch.equal(g, x)


@pytest.mark.parametrize("stream,error,words", [
    (-1, ValueError, "cudaStream_t as an int (0 or more) or None, not -1"),
    ("default", TypeError, "stream must be a cudaStream_t as an int"),
    (1.5, TypeError, "not float"),
])
def test_a_stream_that_is_no_cuda_stream_is_refused_by_name(stream, error, words):
    q, k, v, w = operands()
    with pytest.raises(error, match=re.escape(words)):
        mhla.forward(q, k, v, w, layout=LAYOUT, stream=stream)


# ---- on a GPU ----------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)])
def test_forward_and_backward_on_cuda_match_the_cpu(dtype, tolerance):
    q, k, v, w = operands(dtype)
    state = mhla.ForwardState()
    want_o = mhla.forward(q, k, v, w, layout=LAYOUT, state=state)
    grad_o = torch.randn_like(want_o)
    want = mhla.backward(q, k, v, w, want_o, grad_o, layout=LAYOUT, state=state)
    cuda = [x.cuda() for x in (q, k, v, w)]
    on_device = mhla.ForwardState()
    o = mhla.forward(*cuda, layout=LAYOUT, state=on_device)
    assert o.device == q.cuda().device and o.dtype == dtype
    got = mhla.backward(*cuda, o, grad_o.cuda(), layout=LAYOUT, state=on_device)
    for name, g, x in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], (o,) + got,
                          (want_o,) + want):
        assert g.is_cuda, name
        torch.testing.assert_close(g.cpu().float(), x.float(), rtol=tolerance, atol=tolerance,
                                   msg=lambda m: f"{name}: {m}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_forward_state_on_cuda_gives_the_recomputed_gradients(dtype):
    q, k, v, w = operands(dtype, device="cuda")
    o = mhla.forward(q, k, v, w, layout=LAYOUT)
    grad_o = torch.randn_like(o)
    want = mhla.backward(q, k, v, w, o, grad_o, layout=LAYOUT)
    state = mhla.ForwardState()
    o_kept = mhla.forward(q, k, v, w, layout=LAYOUT, state=state)
    assert torch.equal(o_kept, o)
    got = mhla.backward(q, k, v, w, o_kept, grad_o, layout=LAYOUT, state=state)
    for name, g, x in zip(["grad_q", "grad_k", "grad_v", "grad_w"], got, want):
        assert g.is_cuda and torch.equal(g, x), name


@gpu
@pytest.mark.parametrize("given", [False, True], ids=["legacy-stream", "stream-given"])
def test_work_pending_on_the_callers_stream_is_ordered_before_and_after_the_call(given):
    # The call on the legacy default stream (stream= not given), or on the side stream itself.
    q, k, v, w = operands()
    want_o = mhla.forward(q, k, v, w, layout=LAYOUT)
    grad_o = torch.randn_like(want_o)
    want = mhla.backward(q, k, v, w, want_o, grad_o, layout=LAYOUT)
    staged = [x.cuda() for x in (q, k, v, w, grad_o)]
    q_cuda = torch.zeros_like(staged[0])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    stream = dict(stream=side.cuda_stream) if given else {}
    with torch.cuda.stream(side):
        # q is written on the side stream after a long sleep, a copy the host
        # does not wait for: a call that is not ordered after it reads zeros.
        torch.cuda._sleep(200_000_000)
        q_cuda.copy_(staged[0])
        o = mhla.forward(q_cuda, *staged[1:4], layout=LAYOUT, **stream)
        grads = mhla.backward(q_cuda, *staged[1:4], o, staged[4], layout=LAYOUT, **stream)
        doubled = [2 * x for x in (o, *grads)]  # on the side stream: must see the results written
    torch.cuda.synchronize()
    for name, got, x in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], doubled, (want_o, *want)):
        torch.testing.assert_close(got.cpu(), 2 * x, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


@gpu
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)])
def test_mhla_torch_runs_cuda_tensors_on_the_cuda_kernels_when_asked(dtype, tolerance):
    _check_mhla_torch_on_cuda(dtype, tolerance)


@gpu
@pytest.mark.parametrize("family,dtype,tolerance", [("float16_tensor_cores", torch.float16, 1e-2),
                                                    ("float32_tensor_cores", torch.float32, 1e-3)])
def test_mhla_torch_on_the_tensor_core_kernels_a_call_asks_for(family, dtype, tolerance):
    # The kernel families are arguments of the call: float16, and float32 on split bfloat16 products.
    _check_mhla_torch_on_cuda(dtype, tolerance, cuda_kernels=(family,))


def _check_mhla_torch_on_cuda(dtype, tolerance, cuda_kernels=None):
    import mhla.torch as mt
    q, k, v, w = operands(dtype)
    grad_o = torch.randn(*q.shape[:3], DV, dtype=dtype)

    def run(device, backend, compiled=False):
        xs = [x.to(device).requires_grad_() for x in (q, k, v, w)]
        attention = lambda *a: mt.mhla_attention(*a, LAYOUT, backend=backend, cuda_kernels=cuda_kernels)  # noqa: E731
        o = (torch.compile(attention, fullgraph=True) if compiled else attention)(*xs)
        o.backward(grad_o.to(device))
        return [o.detach().cpu().float()] + [x.grad.cpu().float() for x in xs]

    want = run("cpu", "cpp")
    from mhla import _custom_ops
    for compiled in (False, True) if _custom_ops.AVAILABLE else (False,):
        for name, got, x in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], run("cuda", "cpp", compiled), want):
            torch.testing.assert_close(got, x, rtol=tolerance, atol=tolerance,
                                       msg=lambda m: f"{name} (compiled {compiled}): {m}")


@gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_mhla_torch_training_reaches_the_bf16_state_kernels(compiled):
    # Asked for the bf16-state kernels, a bfloat16 forward keeps no state and the backward runs the
    # state kernels (Dk, Dv multiples of 8). Errors relative to each result's scale, at the
    # tolerances of the kernels' tiling emulation (tests/cuda/bf16_state_cases.hpp).
    import mhla.torch as mt
    from mhla import _custom_ops, _operators, _plan
    if compiled and not _custom_ops.AVAILABLE:
        pytest.skip(f"torch.library.custom_op needs torch 2.4 or later (this is {torch.__version__})")
    g = torch.Generator().manual_seed(3)
    n, m = LAYOUT.num_tokens, LAYOUT.num_blocks
    q, k, v, grad_o = (torch.randn(2, n, HEADS, 16, generator=g) for _ in range(4))
    w = 0.2 + torch.rand(m, m, generator=g)
    assert not _plan.keeps_state(q.cuda().bfloat16(), _plan.cuda_kernel_bits(["bf16_state"]), True)

    def run(device, dtype):
        w_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        xs = [x.to(device, dtype).requires_grad_() for x in (q, k, v)] + [w.to(device, w_dtype).requires_grad_()]
        attention = lambda *a: mt.mhla_attention(*a, LAYOUT, backend="cpp", cuda_kernels=("bf16_state",))  # noqa: E731
        o = (torch.compile(attention, fullgraph=True) if compiled and device == "cuda" else attention)(*xs)
        o.backward(grad_o.to(device, dtype))
        return [o.detach().cpu().double()] + [x.grad.cpu().double() for x in xs]

    want = run("cpu", torch.float64)
    for name, got, x, tolerance in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], run("cuda", torch.bfloat16),
                                       want, [1e-2] * 4 + [0.06]):
        error = (got - x).abs().max() / x.abs().max()
        assert error <= tolerance, f"{name}: relative error {error:.3g} over {tolerance}"


@gpu
def test_the_mhla_op_passes_torchs_checks_on_cuda():
    from mhla import _custom_ops
    from mhla._torch_forms.chunk import Geometry
    if not _custom_ops.AVAILABLE:
        pytest.skip(f"torch.library.custom_op needs torch 2.4 or later (this is {torch.__version__})")
    q, k, v, w = (x.cuda().requires_grad_() for x in operands())
    geometry = Geometry.of(LAYOUT)
    torch.library.opcheck(_custom_ops.forward, (q, k, v, w, geometry.rank, list(geometry.grid),
                                                list(geometry.tile), "none", "elu1", True, 1e-6, None, "dense", 0))


@gpu
def test_operands_on_two_devices_are_refused_by_name():
    q, k, v, w = operands()
    with pytest.raises(ValueError, match="k is on the cpu device but q is on the cuda device"):
        mhla.forward(q.cuda(), k, v.cuda(), w.cuda(), layout=LAYOUT)


@gpu
def test_numpy_refuses_a_cuda_result_by_name():
    q, k, v, w = (x.cuda() for x in operands())
    o = _core.forward(q, k, v, w, layout=LAYOUT)
    assert o.__dlpack_device__() == (2, q.device.index or 0)
    with pytest.raises(TypeError, match="is not host memory that NumPy can read"):
        numpy.asarray(o)
