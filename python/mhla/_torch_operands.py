"""How torch tensors cross into the extension and its results come back, for every torch caller
(``_operators``, which both the eager autograd function and the custom ops run)."""
import torch
from torch.utils.dlpack import from_dlpack


def operand(t):
    # The extension reads the memory directly: no graph, C order.
    return t.detach().contiguous()


def stream_of(t):
    """torch's current stream on ``t``'s CUDA device, as the extension takes it (``stream=``: its
    calls on CUDA tensors run there, ordered with torch's work); None for other devices."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def tensors(*buffers):
    """The extension's result buffers as torch tensors sharing their memory."""
    return tuple(from_dlpack(b) for b in buffers)
