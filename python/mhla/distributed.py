"""Context-parallel MHLA over ``torch.distributed``: one sequence split over ranks.

Each rank of a process group holds a contiguous range of whole blocks of the
same sequences (``mhla.plan_shards``: 1D sequences cut between blocks, grids
between rows or frames of tiles) and passes its shard ``q, k [B, N_r, H, Dk]``,
``v [B, N_r, H, Dv]``. The ranks exchange block summaries (``M x Dk x (Dv + 1)``
numbers per head), never tokens, and the results equal ``mhla_attention`` on the
whole sequence: the rank's rows of the output, and in backward its rows of the
q, k, v gradients and its share of the gradient of ``w``. As for every other
parameter of a model trained this way (projections, norms), the gradient of
``w`` is complete once summed over the group, e.g. by DistributedDataParallel
or ``dist.all_reduce``; the summaries' gradients are exchanged inside.

The arithmetic is the C++ phase functions (``mhla._core.block_summaries``,
``mix_summaries``, ``read_out`` and their backward); the communication is
``torch.distributed``: ``gloo`` on the CPU, and NCCL unchanged (the exchanged
tensors then travel through the current CUDA device). Before each exchange the
ranks agree on whether any rank failed, so that an error on one rank (a shard
cut inside a block, different options or w, a bad shape) is raised on every
rank with the rank's name instead of leaving the others waiting.

The C++ library has the same layer over MPI (``mhla/context_parallel_mpi.hpp``).
"""
import zlib

import torch
import torch.distributed as dist

from . import _contract, _core
from ._torch_operands import operand as _operand, tensors as _tensors
from .torch import MHLA1d, MHLA2d, MHLA3d

__all__ = [
    "context_parallel_attention",
    "ContextParallelMHLA1d",
    "ContextParallelMHLA2d",
    "ContextParallelMHLA3d",
]


def _comm_device(group):
    # NCCL moves CUDA tensors only; the kernels run on the CPU either way.
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global_rank(group, rank):
    # broadcast names its source by global rank; torch 1.13 has only the private helper.
    if group is None:
        return rank
    helper = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return helper(group, rank)


def _agree(group, what, work):
    """Runs ``work()`` on this rank; if it raised on any rank, every rank raises.

    The lowest failing rank's message is broadcast, so all ranks raise the same
    ``ValueError("<what>: rank R: <message>")``.
    """
    error, result = None, None
    try:
        result = work()
    except Exception as e:  # reported to every rank below, then raised
        error = e
    device = _comm_device(group)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    first = torch.tensor([rank if error is not None else world], dtype=torch.int64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    first = int(first.item())
    if first == world:
        return result
    message = torch.zeros(1024, dtype=torch.uint8, device=device)
    if rank == first:
        text = str(error).encode()[:1023]
        message[: len(text)] = torch.tensor(list(text), dtype=torch.uint8, device=device)
    dist.broadcast(message, src=_global_rank(group, first), group=group)
    text = bytes(message.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
    raise ValueError(f"{what}: rank {first}: {text}") from error


def _describe(q, v, w, options):
    """What every rank must agree on; the token count N_r is the one entry that may differ."""
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q and v must be this rank's shard [B, N_r, H, D]; got q {tuple(q.shape)} "
                         f"and v {tuple(v.shape)}")
    w_bytes = w.detach().contiguous().cpu().numpy().tobytes()
    return dict(sizes=(q.shape[0], q.shape[2], q.shape[3], v.shape[3]), dtype=str(q.dtype),
                options=repr(options), w_shape=tuple(w.shape), w_checksum=zlib.crc32(w_bytes)), q.shape[1]


def _agree_on_call(group, what, q, v, w, options):
    description, tokens = _agree(group, what, lambda: _describe(q, v, w, options))
    world = dist.get_world_size(group)
    described = [None] * world
    dist.all_gather_object(described, (description, tokens), group=group)
    for r, (d, _) in enumerate(described):
        for key, value in d.items():
            if value != described[0][0][key]:
                raise ValueError(f"{what}: rank {r} disagrees with rank 0 on {key}: {value} vs "
                                 f"{described[0][0][key]} (every rank must pass the same options, w and "
                                 f"sizes B, H, Dk, Dv)")
    try:
        return _core.plan_shards(options.layout, [t for _, t in described])
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from e


def _local_options(options, shard):
    return _core.Options(shard.layout, masking=options.masking, feature_map=options.feature_map,
                         normalize=options.normalize, eps=options.eps, scale=options.scale,
                         mixing=options.mixing)


def _gather_summaries(group, shards, local_summaries):
    """All ranks' summaries [B, H, M_r, E...] -> [B, H, M, E...] in block order (all-gather, padded)."""
    device = _comm_device(group)
    most = max(s.blocks for s in shards)
    shape = list(local_summaries.shape)
    padded = torch.zeros(shape[:2] + [most] + shape[3:], dtype=local_summaries.dtype, device=device)
    padded[:, :, : local_summaries.shape[2]] = local_summaries.to(device)
    parts = [torch.empty_like(padded) for _ in shards]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:, :, : s.blocks] for p, s in zip(parts, shards)], dim=2).cpu().contiguous()


def _all_reduce_sum(group, t):
    device = _comm_device(group)
    t = t.to(device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.cpu().contiguous()


class _ContextParallelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, options, group):
        what = "mhla.distributed.context_parallel_attention"
        q, k, v, w = (_operand(t) for t in (q, k, v, w))
        shards = _agree_on_call(group, what, q, v, w, options)
        shard = shards[dist.get_rank(group)]
        local = _local_options(options, shard)
        (summaries,) = _tensors(_agree(group, what, lambda: _core.block_summaries(k, v, options=local)))
        all_summaries = _gather_summaries(group, shards, summaries)

        def mix_and_read_out():
            (mixed,) = _tensors(_core.mix_summaries(w, all_summaries, options=local, first_block=shard.first_block,
                                                    blocks=shard.blocks))
            (o,) = _tensors(_core.read_out(q, k, v, w, mixed, options=local, first_block=shard.first_block))
            return mixed, o

        mixed, o = _agree(group, what, mix_and_read_out)
        # [B, H, M, Dk, Dv + 1] per rank, independent of N: kept so that backward
        # needs no second exchange of summaries.
        ctx.save_for_backward(q, k, v, w, o, all_summaries, mixed)
        ctx.local, ctx.shard, ctx.group = local, shard, group
        return o

    @staticmethod
    def backward(ctx, grad_o):
        what = "mhla.distributed.context_parallel_attention (backward)"
        if torch.is_grad_enabled():
            # create_graph=True: the phases' gradients are no graph, and a second-order pass
            # would need its own exchanges between the ranks. Refused, never a missing term.
            raise RuntimeError(f"{what}: second-order gradients (create_graph=True) are not implemented with "
                               "context parallelism; differentiate mhla.torch.mhla_attention on the whole sequence")
        q, k, v, w, o, all_summaries, mixed = (t.detach() for t in ctx.saved_tensors)
        local, shard, group = ctx.local, ctx.shard, ctx.group
        grad_o = _operand(grad_o)

        def phases_3_and_2():
            gq, gk, gv, gmixed, gw = _tensors(*_core.read_out_backward(
                q, k, v, w, mixed, o, grad_o, options=local, first_block=shard.first_block))
            gs, gw2 = _tensors(*_core.mix_summaries_backward(w, all_summaries, gmixed, options=local,
                                                             first_block=shard.first_block))
            return gq, gk, gv, gs, gw + gw2

        gq, gk, gv, gs, gw = _agree(group, what, phases_3_and_2)
        # Each block's summary gradient: the sum over the ranks that read it.
        gs = _all_reduce_sum(group, gs)[:, :, shard.first_block: shard.first_block + shard.blocks].contiguous()
        gk2, gv2 = _agree(group, what, lambda: _tensors(*_core.block_summaries_backward(k, v, gs, options=local)))
        # w's gradient stays this rank's share, like every parameter's under
        # context parallelism: the usual all-reduce of gradients over the group
        # (DDP's) then sums it once.
        return gq, gk + gk2, gv + gv2, gw, None, None


def context_parallel_attention(q, k, v, w, layout, *, group=None, masking=None, feature_map=None, normalize=None,
                               eps=None, scale=None, mixing=None):
    """MHLA on this rank's shard ``q, k [B, N_r, H, Dk]``, ``v [B, N_r, H, Dv]`` of one sequence.

    ``layout`` is the WHOLE sequence's ``mhla.Layout``; ``w`` and the options are the
    same on every rank of ``group`` (default: the world). Returns this rank's rows of
    ``mhla.torch.mhla_attention(q_all, k_all, v_all, w, layout, ...)``; differentiable
    in q, k, v and w (w's gradient is this rank's share: sum it over the group).
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    options = _core.Options(layout, masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
                            scale=scale, mixing=mixing)
    return _ContextParallelFunction.apply(q, k, v, w.to(q.dtype), options, group)


class _ContextParallelLayer:
    """Mixin: the layer runs on this rank's shard ``x [B, N_r, dim]`` of a sequence split over ``group``."""

    def __init__(self, *args, group=None, **options):
        if options.get("pos_conv"):
            raise ValueError("pos_conv needs the tokens of the neighbouring ranks; it is not offered with "
                             "context parallelism")
        super().__init__(*args, **options)
        self.group = group

    def _layout(self, tokens):
        # The mixing matrix and the operator see the whole sequence.
        total = torch.tensor([tokens], dtype=torch.int64, device=_comm_device(self.group))
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return super()._layout(int(total.item()))

    def attend(self, q, k, v, w, layout):
        return context_parallel_attention(q, k, v, w, layout, group=self.group, masking=self.masking,
                                          feature_map=self.feature_map)


class ContextParallelMHLA1d(_ContextParallelLayer, MHLA1d):
    """``MHLA1d`` on this rank's shard of each sequence (whole blocks; see ``mhla.plan_shards``)."""


class ContextParallelMHLA2d(_ContextParallelLayer, MHLA2d):
    """``MHLA2d`` on this rank's rows of tiles of the image grid."""


class ContextParallelMHLA3d(_ContextParallelLayer, MHLA3d):
    """``MHLA3d`` on this rank's frames of tiles of the video grid."""
