"""Streaming causal MHLA with its state in torch tensors on any device: ``mhla.Decoder``'s contract
(prefill, step, position, reset) for a ``w`` that is not on the CPU, and ``MHLA1d``'s cache there.

Per sequence and head it keeps the running block's summary ``[S | z]`` (``Dk x (Dv + 1)``), the
mixed summaries of the finished blocks for the current block, ``W[i, i]``, and the finished blocks
themselves: all of them for dense w (at most M), or for Toeplitz w the last ``L - 1`` and the sum of
the rest. A token costs ``O(H Dk Dv)``; finishing a block ``O(M H Dk Dv)`` (dense) or
``O(L H Dk Dv)`` (Toeplitz). Computed in float32, like the C++ decoder.
"""
import math

import torch

from .. import _core, _finite_results
from . import chunk, lean


class TorchDecoder:
    def __init__(self, w, options):
        self.options = options
        self.toeplitz = options.mixing.name == "toeplitz"
        self.feature_map = options.feature_map.name
        heads, block = options.heads, options.block
        self._check_w(w)
        self.w = w.detach().to(torch.float32)
        self.per_head = self.w.dim() == (2 if self.toeplitz else 3)
        self.length = self.w.shape[-1] - 1 if self.toeplitz else None  # L
        self.blocks = None if self.toeplitz else self.w.shape[-1]  # M
        self.scale = options.scale if options.scale is not None else 1.0 / math.sqrt(options.dk)
        x = (options.dk, options.dv + 1)
        zeros = dict(dtype=torch.float32, device=self.w.device)
        b = options.batch
        self.running = torch.zeros(b, heads, *x, **zeros)
        self.prefix = torch.zeros(b, heads, *x, **zeros)
        self.diagonal = torch.zeros(b, heads, **zeros)
        # Dense: every finished block; Toeplitz: the last L - 1 (nearest first) and the sum of the rest.
        kept = self.blocks if not self.toeplitz else max(self.length - 1, 0)
        self.finished = torch.zeros(b, heads, kept, *x, **zeros)
        self.far = torch.zeros(b, heads, *x, **zeros)
        self.positions = [0] * b
        self.block = block
        for seq in range(b):
            self._enter_block(seq, 0)

    def _check_w(self, w):
        # mhla::Decoder's own checks, on a CPU copy of w: read once, when the decoder is made (a
        # wait for the device, not one per token).
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"w must be a torch tensor for a decoder in torch tensors, not {type(w).__name__}")
        _core._check_decoder(self.options, w.detach().cpu().contiguous())

    @property
    def max_tokens(self):
        return None if self.toeplitz else self.blocks * self.options.block

    def position(self, seq):
        _core._check_decoder_sequence("mhla::Decoder::position", self.options, seq)
        return self.positions[seq]

    def _weight(self, i, b):
        """``W[i, b]`` for every head: ``[H]``."""
        heads = self.options.heads
        if self.toeplitz:
            value = self.w[..., min(i - b, self.length)]
        else:
            value = self.w[..., i, b]
        return value.expand(heads) if value.dim() == 0 else value

    def _enter_block(self, seq, i):
        """Sequence ``seq`` starts block ``i``: its mixed prefix and ``W[i, i]``."""
        if not self.toeplitz and i >= self.blocks:
            return  # the context is full; the next token is refused
        if self.toeplitz:
            prefix = self._weight(i, i - max(self.length, 1)).view(-1, 1, 1) * self.far[seq]
            for d in range(1, min(self.length, i + 1)):
                prefix = prefix + self._weight(i, i - d).view(-1, 1, 1) * self.finished[seq, :, d - 1]
        else:
            rows = self.w[..., i, :i]  # [i] or [H, i]
            rows = rows.expand(self.options.heads, i) if rows.dim() == 1 else rows
            prefix = torch.einsum("hj,hjde->hde", rows, self.finished[seq, :, :i])
        self.prefix[seq] = prefix
        self.diagonal[seq] = self._weight(i, i)

    def _finish_block(self, seq, i, summary):
        """Block ``i`` of ``seq`` is complete with ``summary`` ``[H, Dk, Dv + 1]``."""
        if not self.toeplitz:
            self.finished[seq, :, i] = summary
            return
        kept = self.finished.shape[2]
        if kept == 0:
            self.far[seq] += summary
            return
        self.far[seq] += self.finished[seq, :, kept - 1]
        self.finished[seq, :, 1:] = self.finished[seq, :, :-1].clone()
        self.finished[seq, :, 0] = summary

    def _features(self, q, k, v):
        phi_q = chunk.feature(q.to(torch.float32), self.feature_map)
        phi_k = chunk.feature(k.to(torch.float32), self.feature_map)
        v1 = torch.cat([v.to(torch.float32), v.new_ones(*v.shape[:-1], 1, dtype=torch.float32)], dim=-1)
        return phi_q, phi_k, v1

    def _tokens(self, function, q, k, v):
        """q, k, v as torch tensors on the state's device (a NumPy array on the CPU is read as one)."""
        tensors = []
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                if not hasattr(t, "__dlpack__"):
                    raise TypeError(f"{name} must be a tensor that supports DLPack (torch.Tensor, numpy.ndarray), "
                                    f"not {type(t).__name__}")
                t = torch.from_dlpack(t)
            if t.device != self.w.device:
                raise ValueError(f"{function}: {name} is on {t.device} but the decoder's state is on "
                                 f"{self.w.device}; pass every tensor of the call on one device")
            tensors.append(t)
        return tensors

    def step(self, q, k, v):
        """One token for every sequence: ``q, k [B, 1, H, Dk]``, ``v [B, 1, H, Dv]``."""
        batch = self.options.batch
        q, k, v = self._tokens("mhla::Decoder::step", q, k, v)
        _core._check_decoder_step(self.options, list(self.w.shape), self.positions,
                                  *(list(t.shape) for t in (q, k, v)))
        phi_q, phi_k, v1 = self._features(q[:, 0], k[:, 0], v[:, 0])  # [B, H, .]
        self.running += phi_k.unsqueeze(-1) * v1.unsqueeze(-2)
        state = self.prefix + self.diagonal.unsqueeze(-1).unsqueeze(-1) * self.running
        y = torch.einsum("bhd,bhdx->bhx", phi_q, state)
        dv, normalize = self.options.dv, self.options.normalize
        divisor = y[..., dv:] + self.options.eps if normalize else None
        o = (y[..., :dv] / divisor if normalize else self.scale * y[..., :dv]).unsqueeze(1)
        for seq in range(batch):
            self.positions[seq] += 1
            if self.positions[seq] % self.block == 0:
                i = self.positions[seq] // self.block - 1
                self._finish_block(seq, i, self.running[seq].clone())
                self.running[seq].zero_()
                self._enter_block(seq, i + 1)
        # As the C++ decoder: checked once the token is in the state, which the message says.
        base = self._message("mhla::Decoder::step")
        _finite_results.check_results(
            {"o": o}, dict(q=q, k=k, v=v),
            lambda *args: base(*args) + " (the token was added to the state; reset the sequence)",
            denominator=chunk.read_out_denominators(divisor) if normalize else (),
            denominator_entry=(lambda: chunk.read_out_entry((y[..., :dv] * divisor.reciprocal()).unsqueeze(1)))
            if normalize else None)
        return o.to(q.dtype)

    def _message(self, function):
        o = self.options
        return chunk.non_finite_message(function, self.feature_map, o.normalize, o.eps, o.dk, torch.float32)

    def prefill(self, seq, q, k, v):
        """A prompt ``[1, L, H, D]`` for the empty sequence ``seq``; returns ``o [1, L, H, Dv]``."""
        _core._check_decoder_sequence("mhla::Decoder::prefill", self.options, seq)
        q, k, v = self._tokens("mhla::Decoder::prefill", q, k, v)
        _core._check_decoder_prefill(self.options, list(self.w.shape), seq, self.positions[seq],
                                     *(list(t.shape) for t in (q, k, v)))
        n, c = q.shape[1], self.block
        layout = _core.Layout.sequence(n, c)
        m = layout.num_blocks
        w = self.w if self.toeplitz else self.w[..., :m, :m]
        o = lean.mhla_attention(q, k, v, w, layout, masking="causal", feature_map=self.feature_map,
                                 normalize=self.options.normalize, eps=self.options.eps, scale=self.options.scale,
                                 mixing=self.options.mixing.name, function="mhla::Decoder::prefill")
        # The state: each block's summary, the last (maybe partial) one running.
        _, phi_k, v1 = self._features(q[0], k[0], v[0])  # [L, H, .]
        pad = m * c - n
        phi_k = torch.cat([phi_k, phi_k.new_zeros(pad, *phi_k.shape[1:])]).view(m, c, *phi_k.shape[1:])
        v1 = torch.cat([v1, v1.new_zeros(pad, *v1.shape[1:])]).view(m, c, *v1.shape[1:])
        summaries = torch.einsum("mchd,mche->mhde", phi_k, v1)
        full = n // c
        for i in range(full):
            self._finish_block(seq, i, summaries[i])
        self.running[seq] = summaries[full] if full < m else 0
        self.positions[seq] = n
        self._enter_block(seq, full)
        return o.to(q.dtype)

    def reset(self, seq):
        _core._check_decoder_sequence("mhla::Decoder::reset", self.options, seq)
        for state in (self.running, self.prefix, self.finished, self.far):
            state[seq].zero_()
        self.positions[seq] = 0
        self._enter_block(seq, 0)

    @property
    def state_bytes(self):
        return 4 * sum(t.numel() for t in (self.running, self.prefix, self.diagonal, self.finished, self.far))

    def serialize(self):
        raise TypeError(f"mhla::Decoder::serialize: this decoder keeps its state in torch tensors on {self.w.device} "
                        "(backend='torch', or a w not on the CPU), which have no snapshot format; to save, load or "
                        "pickle a decoder, make it from a CPU w with backend=None or 'cpp'")

    def save(self, path):
        self.serialize()
