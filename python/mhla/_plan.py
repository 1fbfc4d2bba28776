"""How a call runs, decided in one place for every function, layer and integration of ``mhla.torch``.

``plan`` turns what a call is (which operator, its tensors' dtype, shape and devices, its masking,
the ``backend`` it asked for, its CUDA kernel families, whether it will be differentiated) into a
``Plan``: the path, the CUDA kernel families it runs on, the dtypes its tensors cross into the
extension in, and whether forward keeps state for backward. A CUDA call that names neither a backend
nor kernel families runs where the measured table (``_cuda_dispatch``) says it is fastest. The
callers only follow the plan.
"""
from typing import NamedTuple

from . import _core, _cuda_dispatch

try:
    import torch

    from ._torch_forms import chunk
except ImportError:  # mhla.Decoder on NumPy arrays plans without torch
    torch = None

BACKENDS = ("cpp", "torch")
# Whether torch registers the extension as custom ops that torch.compile traces (torch 2.4 and later:
# torch.library.custom_op; _custom_ops registers them).
CUSTOM_OPS = torch is not None and hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")
# The CUDA kernel families a call may name (mhla.CudaKernels' fields), as bits for the custom op.
CUDA_KERNELS = ("bf16_state", "float16_tensor_cores", "float32_tensor_cores")
# The operators a plan is made for; "decoder" is mhla.Decoder (a state, not a differentiable call).
ENTRIES = ("mhla", "varlen", "linear", "softmax", "decoder")
_REDUCED = (torch.bfloat16, torch.float16) if torch else ()


# A named tuple, whose making torch.compile traces; its dtype annotations are strings, since the
# decoder's plan is made without torch.
class Plan(NamedTuple):
    path: str                     # "torch" (plain torch ops), "cpp" (the extension, eager), "custom_op"
                                  # (the extension's torch.library op, inside torch.compile)
    cuda_kernels: int             # the CUDA kernel families the extension may run it on (cuda_kernel_bits)
    operand_dtype: "torch.dtype"  # q, k, v cross into the extension in this dtype ...
    w_dtype: "torch.dtype"        # ... and w in this one
    keeps_state: bool             # forward keeps its summaries for backward ("mhla" only)


def check_backend(backend):
    """A ValueError naming an unknown ``backend`` (layers and decoders check it when they are made)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected None (by device), 'cpp' or 'torch'")


def _device_type(t):
    # A torch.device, or the array API's string (NumPy 2 arrays have .device == "cpu"); CPU without one.
    device = getattr(t, "device", "cpu")
    return getattr(device, "type", device)


def _path(entry, backend, tensors):
    """The C++ operator reads CPU memory only: by default other devices run in torch ops. Meta tensors
    hold no values: on either backend they give a meta result of the right shape and dtype, as torch's
    own ops do (models built on the meta device, shape propagation), by the torch forms."""
    check_backend(backend)
    devices = [_device_type(t) for t in tensors]
    if backend == "torch" or "meta" in devices or (backend is None and any(d != "cpu" for d in devices)):
        return "torch"
    if entry == "decoder":
        return "cpp"
    if chunk.compiling() and CUSTOM_OPS:
        return "custom_op"
    return "cpp"  # in a compiled region before torch 2.4, the extension call breaks the graph


def _compute_dtype(dtype):
    """The dtype the C++ operators compute in: float32 for bfloat16 and float16, else ``dtype``."""
    return torch.float32 if dtype in _REDUCED else dtype


def cuda_kernel_bits(names):
    """``names`` (an iterable of ``CUDA_KERNELS``' entries, or None) as an int of one bit each; a
    ValueError names an unknown one. Pure Python, for compiled regions."""
    bits = 0
    for name in names or ():
        if name not in CUDA_KERNELS:
            raise ValueError(f"unknown CUDA kernel family {name!r}; expected any of {', '.join(CUDA_KERNELS)}")
        bits |= 1 << CUDA_KERNELS.index(name)
    return bits


def keeps_state(q, cuda_kernels, needs_grad):
    """Whether an MHLA forward keeps its summaries and mixed summaries for the backward: when it
    will be differentiated, except for a CUDA call on the bfloat16-state kernels (bfloat16 q, or
    float16 q that also runs on the float16 tensor-core kernels), whose backward recomputes its
    state and reads none. ``cuda_kernels``: ``cuda_kernel_bits``' int."""
    allowed = {name: bool(cuda_kernels >> i & 1) for i, name in enumerate(CUDA_KERNELS)}
    on_state_kernels = q.dtype == torch.bfloat16 or (q.dtype == torch.float16 and allowed["float16_tensor_cores"])
    return needs_grad and not (_device_type(q) == "cuda" and on_state_kernels and allowed["bf16_state"])


def shape_class(tokens, head_dim):
    """The measured table's classes of a shape: (more than 16,384 tokens, heads of more than 64
    features); None for heads of more than 128, which no kernel family takes."""
    return None if head_dim > 128 else (tokens > 16384, head_dim > 64)


def measured_choice(dtype, masking, tokens, head_dim, needs_grad, rows=None):
    """The path and kernel families (``cuda_kernel_bits``) of the measured table's row
    (``_cuda_dispatch.ROWS``, or ``rows``) for a CUDA call, or None where no row covers it."""
    key = (str(dtype).replace("torch.", ""), masking, needs_grad, shape_class(tokens, head_dim))
    for row in _cuda_dispatch.ROWS if rows is None else rows:
        if (row["dtype"], row["masking"], row["needs_grad"], (row["long_sequence"], row["wide_heads"])) == key:
            return row["path"], cuda_kernel_bits(row["cuda_kernels"])
    return None


def plan(entry, tensors, *, backend=None, cuda_kernels=None, needs_grad=False, masking="none"):
    """The ``Plan`` of a call of ``entry`` (one of ``ENTRIES``) on ``tensors`` (q ``[B, N, H, D]``
    first; w alone for the decoder), with its ``masking``'s name, the ``backend`` it names (None: by
    device), the CUDA kernel families it names (``cuda_kernel_bits``; None: none named) and whether
    its result will be differentiated."""
    if entry not in ENTRIES:
        raise ValueError(f"unknown entry {entry!r}")
    path = _path(entry, backend, tensors)
    q = tensors[0]
    if entry == "decoder":  # one dtype, float32, whatever the path
        return Plan(path, 0, None, None, False)
    if cuda_kernels is None:
        cuda_kernels = 0
        if (entry == "mhla" and backend is None and path == "torch" and _device_type(q) == "cuda"
                and _core.has_cuda_backend and q.dim() == 4 and not chunk.compiling()):
            choice = measured_choice(q.dtype, masking, q.shape[1], q.shape[3], needs_grad)
            if choice is not None:
                path, cuda_kernels = choice
    dtype = q.dtype
    # The operator takes bfloat16 and float16 q, k, v (one dtype: _contract) as they are, with
    # float32 w; the other entries take float32 and float64 only, so reduced inputs cross as
    # float32 copies.
    native = entry == "mhla" and dtype in _REDUCED
    operand_dtype = dtype if native else _compute_dtype(dtype)
    return Plan(path, cuda_kernels, operand_dtype, _compute_dtype(dtype),
                entry == "mhla" and keeps_state(q, cuda_kernels, needs_grad))
