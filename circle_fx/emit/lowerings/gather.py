"""Advanced indexing ``x[idx]`` (``aten.index.Tensor``) with one index tensor -> GATHER.

MoE layers pick expert weights this way (``gate_up_proj[expert_ids]``). One index
tensor at dimension d, every other position ``None`` (a full slice), is exactly
GATHER on axis d; several index tensors (broadcast together) would need GATHER_ND,
which onert 0.1.0 does not implement, so they are reported instead. Negative indices in a
constant index tensor are wrapped at compile time; a run-time index tensor must hold
non-negative indices (GATHER does not wrap them; MoE routers' topk indices never are).
"""
from __future__ import annotations

import torch

from ...program import fetch_attr
from ..registry import lowering
from ..types import to_numpy
from ._common import BO, options

aten = torch.ops.aten


@lowering(aten.index.Tensor)
def index(ctx, node):
    x, indices = node.args[0], node.args[1]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise ctx.error(f"indexing with {len(given)} index tensors is not supported (only one; "
                        "onert has no GATHER_ND)")
    axis, idx = given[0]
    if ctx.dtype(idx) == torch.bool:
        raise ctx.error("boolean-mask indexing has a data-dependent shape and is not supported")
    ctx.op(BO.GATHER, [ctx.tensor(x), _index(ctx, x, axis, idx)], [ctx.output(node)],
           options("GatherOptions", axis=axis, batchDims=0))


def _index(ctx, x, axis, idx):
    """torch counts negative indices from the end; GATHER would read out of bounds. A constant
    index is wrapped here (a run-time one is passed through: see the module docstring)."""
    if idx.op != "get_attr":
        return ctx.tensor(idx)
    t = fetch_attr(ctx.program.gm, idx.target)
    if not bool((t < 0).any()):
        return ctx.tensor(idx)
    _, sig = ctx.shape_of(x)
    if sig is not None and sig[axis] == -1:
        raise ctx.error(f"negative indices into dynamic dim {axis} of %{x.name} are not supported")
    return ctx.const(to_numpy(torch.where(t < 0, t + ctx.shape_of(x)[0][axis], t)), "index")
