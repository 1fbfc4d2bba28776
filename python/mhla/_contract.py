"""The rule every ``mhla.torch`` entry point applies to its tensors before it chooses a backend.

Types, devices and dtypes are checked here once, whichever path then runs (the C++ operator or
the plain-torch path), so both refuse the same calls with the same words:

- every argument is a ``torch.Tensor``;
- every tensor of a call is on q's device (torch ops refuse a mix too, but a meta or CPU tensor
  among CUDA ones would otherwise pass some of them silently);
- q, k and v share one floating dtype of ``FLOATS``; w, where there is one, is floating point
  (it is cast to the computing dtype; an integer w is refused rather than truncated or cast).
"""
import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def check_tensors(*, function, w=None, **tensors):
    """``tensors`` (q first) and the mixing ``w`` as the contract above demands; TypeError or
    ValueError naming the argument and ``function``, the operator's entry point."""
    named = dict(tensors, **({} if w is None else {"w": w}))
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    first, q = next(iter(tensors.items()))
    for name, t in named.items():
        if t.device != q.device:
            raise ValueError(f"{function}: {name} is on {t.device} but {first} is on {q.device}; pass every "
                             "tensor of the call on one device")
    for name, t in tensors.items():
        if t.dtype not in FLOATS:
            raise TypeError(f"{name} has dtype {dtype_name(t.dtype)}; mhla computes in float16, bfloat16, float32 "
                            "or float64")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {dtype_name(t.dtype)} but {first} has {dtype_name(q.dtype)}; all "
                            "tensors of one call share a dtype")
    if w is not None and not w.dtype.is_floating_point:
        raise TypeError(f"w has dtype {dtype_name(w.dtype)}; it must be a floating-point tensor")
