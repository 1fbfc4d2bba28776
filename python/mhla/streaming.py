"""Streaming decoding (``Decoder``) and packed variable-length batches (``varlen_*``).

Both return results of the same kind as their ``q`` argument (torch tensor,
NumPy array, ...), like the rest of the package. For autograd through packed
batches see ``mhla.torch.varlen_attention``.
"""
from . import _convert, _core, _plan


def offsets(cu_seqlens):
    """``cu_seqlens`` as a list of ints: from a list, a tuple, or an integer torch/NumPy tensor."""
    dtype = getattr(cu_seqlens, "dtype", None)
    if dtype is not None:
        is_float = getattr(dtype, "is_floating_point", None)  # torch
        kind = getattr(dtype, "kind", None)  # NumPy
        if is_float or getattr(dtype, "is_complex", False) or (kind is not None and kind not in "iu"):
            raise TypeError(f"cu_seqlens must hold integers, got dtype {dtype}")
        cu_seqlens = cu_seqlens.tolist()
    if not isinstance(cu_seqlens, (list, tuple)) or not all(isinstance(x, int) for x in cu_seqlens):
        raise TypeError(f"cu_seqlens must be a 1D sequence or tensor of ints, got {cu_seqlens!r:.80}")
    for i, x in enumerate(cu_seqlens):
        if not -2 ** 63 <= x < 2 ** 63:
            raise ValueError(f"cu_seqlens[{i}] = {x} does not fit in int64: offsets count tokens of the packed "
                             "batch, from 0 to its length")
    return list(cu_seqlens)


def varlen_forward(q, k, v, w, cu_seqlens, **options):
    """MHLA of S packed sequences: ``q, k [1, total, H, Dk]``, ``v [1, total, H, Dv]``, sequence ``s``
    holding tokens ``cu_seqlens[s] .. cu_seqlens[s + 1] - 1``; returns ``o [1, total, H, Dv]``.

    Each sequence is its own 1D problem in blocks of ``block`` tokens (keyword, default 64) starting
    at its first token. Dense ``w [M, M]`` (or ``[H, M, M]``) serves sequence ``s`` with its top-left
    ``M_s x M_s`` corner, so M must cover the longest sequence; ``mixing="toeplitz"`` serves any
    length. Other keywords: ``masking``, ``feature_map``, ``normalize``, ``eps``, ``scale``; or all
    of them as one ``options=mhla.VarlenOptions(...)``.
    """
    return _convert.to_kind_of(q, _core.varlen_forward(q, k, v, w, offsets(cu_seqlens), **options))


def varlen_backward(q, k, v, w, o, grad_o, cu_seqlens, **options):
    """Gradients of ``sum(grad_o * o)``: ``(grad_q, grad_k, grad_v, grad_w)``; ``grad_w`` sums every
    sequence's contribution."""
    return _convert.to_kind_of(q, _core.varlen_backward(q, k, v, w, o, grad_o, offsets(cu_seqlens), **options))


def _check_operand(name, t):
    """The decoder's dtype rule for every tensor it is given, on either backend: float32, the
    decoder's one dtype (its state is float32). Objects without a dtype are the backends' to
    name."""
    dtype = getattr(t, "dtype", None)
    if dtype is not None and str(dtype).replace("torch.", "") != "float32":
        raise TypeError(f"{name} has dtype {str(dtype).replace('torch.', '')}; the decoder computes in float32 "
                        "(convert with .float())")


class Decoder:
    """Streaming causal MHLA: a prompt per sequence (``prefill``), then one token for every sequence
    per ``step``. Outputs equal the causal forward on the whole sequence; the state per head is
    O(M Dk Dv) for dense mixing and bounded for Toeplitz mixing (unbounded context). float32.

    ``w`` is the mixing: dense ``[M, M]`` or ``[H, M, M]`` (context of ``M * block`` tokens), or with
    ``mixing="toeplitz"`` ``[L + 1]`` or ``[H, L + 1]``. Keywords as ``mhla.DecoderOptions``.
    Decoders pickle (a versioned, CRC-checked snapshot) and ``save``/``load`` to files.

    A torch ``w`` on another device than the CPU (or ``backend="torch"``) keeps the state in torch
    tensors on w's device, and ``prefill``/``step`` take and return tensors there; such a decoder
    has no snapshot format.
    """

    def __init__(self, w, *, heads, dk, dv, block, batch=1, feature_map=None, normalize=None, eps=None,
                 scale=None, mixing=None, backend=None):
        options = _core.DecoderOptions(batch=batch, heads=heads, dk=dk, dv=dv, block=block,
                                       feature_map=feature_map, normalize=normalize, eps=eps, scale=scale,
                                       mixing=mixing)
        _plan.check_backend(backend)
        _check_operand("w", w)
        if _plan.plan("decoder", (w,), backend=backend).path == "torch":
            from ._torch_forms.recurrent import TorchDecoder  # torch is only needed here

            self._decoder = TorchDecoder(w, options)
        else:
            self._decoder = _core.Decoder(options, w)

    @classmethod
    def _of(cls, core):
        decoder = cls.__new__(cls)
        decoder._decoder = core
        return decoder

    def prefill(self, seq, q, k, v):
        """Feeds a prompt ``q, k [1, L, H, Dk]``, ``v [1, L, H, Dv]`` to the empty sequence ``seq``;
        returns ``o [1, L, H, Dv]``."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_operand(name, t)
        return _convert.to_kind_of(q, self._decoder.prefill(seq, q, k, v))

    def step(self, q, k, v):
        """One token for every sequence: ``q, k [B, 1, H, Dk]``, ``v [B, 1, H, Dv]``; returns
        ``o [B, 1, H, Dv]``."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_operand(name, t)
        return _convert.to_kind_of(q, self._decoder.step(q, k, v))

    def position(self, seq):
        """Tokens seen by sequence ``seq``."""
        return self._decoder.position(seq)

    def reset(self, seq):
        """Empties sequence ``seq`` (the others keep their state)."""
        self._decoder.reset(seq)

    @property
    def options(self):
        return self._decoder.options

    @property
    def max_tokens(self):
        """Context per sequence: ``M * block`` for dense mixing, None (unbounded) for Toeplitz."""
        return self._decoder.max_tokens

    @property
    def state_bytes(self):
        return self._decoder.state_bytes

    @property
    def summary_bytes(self):
        """Bytes of one block summary [S | z] in the state: ``Dk`` rows of ``Dv``
        and then the ``Dk`` key sums, each padded to a multiple of 16 floats."""
        return self._decoder.summary_bytes

    def serialize(self):
        """The whole decoder (options, w, every sequence's position and state) as bytes."""
        return self._decoder.serialize()

    def save(self, path):
        """Writes ``serialize()`` to a temporary file, then renames it over ``path``."""
        self._decoder.save(str(path))

    @classmethod
    def deserialize(cls, data, *, expect=None, source="decoder state"):
        """Rebuilds a decoder from ``serialize()``'s bytes. With ``expect`` (a ``DecoderOptions`` or a
        ``Decoder``), a snapshot of another configuration is a ValueError naming the difference."""
        return cls._of(_core.Decoder.deserialize(bytes(data), expect=_expected(expect), source=source))

    @classmethod
    def load(cls, path, *, expect=None):
        """``deserialize`` of a file written by ``save``; errors name the file."""
        return cls._of(_core.Decoder.load(str(path), expect=_expected(expect)))

    def __getstate__(self):
        return self.serialize()

    def __setstate__(self, data):
        self._decoder = _core.Decoder.deserialize(data, source="pickled mhla.Decoder")

    def __repr__(self):
        positions = [self.position(s) for s in range(self.options.batch)]
        return f"<mhla.Decoder {self.options!r}, positions {positions}>"


def _expected(expect):
    if expect is None or isinstance(expect, _core.DecoderOptions):
        return expect
    if isinstance(expect, Decoder):
        return expect.options
    raise TypeError(f"expect must be an mhla.DecoderOptions or an mhla.Decoder, not {type(expect).__name__}")
