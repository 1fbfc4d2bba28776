"""How torch tensors cross into the extension and its results come back, for every torch caller
(``_operators``, which both the eager autograd function and the custom ops run)."""
import torch
from torch.utils.dlpack import from_dlpack


def compute_dtype(dtype):
    """The dtype the C++ operators compute in for inputs of ``dtype``: float32 for bfloat16 and
    float16, which cross as widened copies (``mhla_attention`` hands bfloat16 q, k, v over as they
    are, with its float32 w), else ``dtype`` itself."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def operand(t):
    # The extension reads the memory directly: no graph, C order.
    return t.detach().contiguous()


def tensors(*buffers):
    """The extension's result buffers as torch tensors sharing their memory."""
    return tuple(from_dlpack(b) for b in buffers)
