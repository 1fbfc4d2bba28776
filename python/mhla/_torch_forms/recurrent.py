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

from .. import _contract, _core
from . import chunk


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
        o = self.options
        want = ("[L + 1] or [H, L + 1]" if self.toeplitz else "[M, M] or [H, M, M]")
        shapes_ok = (w.dim() in (1, 2) and (w.dim() == 1 or w.shape[0] == o.heads)) if self.toeplitz else \
            (w.dim() in (2, 3) and w.shape[-1] == w.shape[-2] and (w.dim() == 2 or w.shape[0] == o.heads))
        if not shapes_ok or w.numel() == 0:
            raise ValueError(f"mhla::Decoder: w has shape [{', '.join(map(str, w.shape))}]; {o.mixing.name} "
                             f"mixing takes {want} with H = {o.heads}")
        if not w.dtype.is_floating_point:
            raise TypeError(f"w has dtype {str(w.dtype).replace('torch.', '')}; the decoder computes in float32")
        # Read once, when the decoder is made (a wait for the device, not one per token).
        if not bool(torch.isfinite(w).all()):
            raise ValueError("mhla::Decoder: w holds a value that is not finite")
        if o.normalize and bool((w < 0).any()):
            raise ValueError("mhla::Decoder: w holds a negative weight; the normalized mode needs non-negative "
                             "mixing weights (use normalize = false, or keep w non-negative)")

    @property
    def max_tokens(self):
        return None if self.toeplitz else self.blocks * self.options.block

    def position(self, seq):
        self._check_seq(seq)
        return self.positions[seq]

    def _check_seq(self, seq):
        if not 0 <= seq < self.options.batch:
            raise ValueError(f"mhla::Decoder: sequence {seq} out of range [0, {self.options.batch})")

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

    def _read_out(self, y):
        dv = self.options.dv
        if self.options.normalize:
            return y[..., :dv] / (y[..., dv:] + self.options.eps)
        return self.scale * y[..., :dv]

    def _check_tokens(self, name, t, batch, tokens=None):
        o = self.options
        shape = list(t.shape)
        dim = o.dv if name == "v" else o.dk
        if t.dim() != 4 or shape[0] != batch or shape[2] != o.heads or shape[3] != dim or \
                (tokens is not None and shape[1] != tokens) or shape[1] == 0:
            want = f"[{batch}, {tokens if tokens is not None else 'L'}, {o.heads}, {dim}]"
            raise ValueError(f"mhla::Decoder: {name} must be {want}; got [{', '.join(map(str, shape))}]")
        # The C++ decoder's rule: float32 tokens (its state is float32), where its state is.
        if t.dtype != torch.float32:
            raise TypeError(f"{name} has dtype {_contract.dtype_name(t.dtype)}; the decoder computes in float32 "
                            "(convert with .float())")
        if t.device != self.w.device:
            raise ValueError(f"mhla::Decoder: {name} is on {t.device} but the decoder's state is on "
                             f"{self.w.device}; pass every tensor of the call on one device")

    def step(self, q, k, v):
        """One token for every sequence: ``q, k [B, 1, H, Dk]``, ``v [B, 1, H, Dv]``."""
        batch = self.options.batch
        for name, t in (("q", q), ("k", k), ("v", v)):
            self._check_tokens(name, t, batch, 1)
        for seq, position in enumerate(self.positions):
            if self.max_tokens is not None and position >= self.max_tokens:
                raise ValueError(f"mhla::Decoder::step: sequence {seq} is full: its context holds "
                                 f"{self.max_tokens} tokens (w is {self.blocks}x{self.blocks} for blocks of "
                                 f"{self.options.block}); reset it or use Toeplitz mixing")
        phi_q, phi_k, v1 = self._features(q[:, 0], k[:, 0], v[:, 0])  # [B, H, .]
        self.running += phi_k.unsqueeze(-1) * v1.unsqueeze(-2)
        state = self.prefix + self.diagonal.unsqueeze(-1).unsqueeze(-1) * self.running
        o = self._read_out(torch.einsum("bhd,bhdx->bhx", phi_q, state))
        for seq in range(batch):
            self.positions[seq] += 1
            if self.positions[seq] % self.block == 0:
                i = self.positions[seq] // self.block - 1
                self._finish_block(seq, i, self.running[seq].clone())
                self.running[seq].zero_()
                self._enter_block(seq, i + 1)
        return o.unsqueeze(1).to(q.dtype)

    def prefill(self, seq, q, k, v):
        """A prompt ``[1, L, H, D]`` for the empty sequence ``seq``; returns ``o [1, L, H, Dv]``."""
        self._check_seq(seq)
        for name, t in (("q", q), ("k", k), ("v", v)):
            self._check_tokens(name, t, 1)
        n, c = q.shape[1], self.block
        if self.positions[seq] != 0:
            raise ValueError(f"mhla::Decoder::prefill: sequence {seq} holds {self.positions[seq]} tokens; "
                             "prefill takes an empty sequence (reset it first)")
        if self.max_tokens is not None and n > self.max_tokens:
            raise ValueError(f"mhla::Decoder::prefill: prompt of {n} tokens exceeds the context of "
                             f"{self.max_tokens} tokens (w is {self.blocks}x{self.blocks} for blocks of {c})")
        layout = _core.Layout.sequence(n, c)
        m = layout.num_blocks
        w = self.w if self.toeplitz else self.w[..., :m, :m]
        o = chunk.mhla_attention(q, k, v, w, layout, masking="causal", feature_map=self.feature_map,
                                       normalize=self.options.normalize, eps=self.options.eps,
                                       scale=self.options.scale, mixing=self.options.mixing.name)
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
        self._check_seq(seq)
        for state in (self.running, self.prefix, self.finished, self.far):
            state[seq].zero_()
        self.positions[seq] = 0
        self._enter_block(seq, 0)

    @property
    def state_bytes(self):
        return 4 * sum(t.numel() for t in (self.running, self.prefix, self.diagonal, self.finished, self.far))

    def serialize(self):
        raise TypeError(f"a decoder whose state is on {self.w.device} has no snapshot format; make it from a "
                        "CPU w to save, load or pickle it")

    def save(self, path):
        self.serialize()
