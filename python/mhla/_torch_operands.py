"""How torch tensors cross into the extension and its results come back, for every torch caller
(``_operators``, which both the eager autograd function and the custom ops run)."""
from torch.utils.dlpack import from_dlpack


def operand(t):
    # The extension reads the memory directly: no graph, C order.
    return t.detach().contiguous()


def tensors(*buffers):
    """The extension's result buffers as torch tensors sharing their memory."""
    return tuple(from_dlpack(b) for b in buffers)
