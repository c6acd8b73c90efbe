"""Advanced indexing ``x[idx]`` (``aten.index.Tensor``) with one index tensor -> GATHER.

MoE layers pick expert weights this way (``gate_up_proj[expert_ids]``). One index
tensor at dimension d, every other position ``None`` (a full slice), is exactly
GATHER on axis d; several index tensors (broadcast together) would need GATHER_ND,
which onert 0.1.0 does not implement, so they are reported instead.
"""
from __future__ import annotations

import torch

from ..registry import lowering
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
    ctx.op(BO.GATHER, [ctx.tensor(x), ctx.tensor(idx)], [ctx.output(node)],
           options("GatherOptions", axis=axis, batchDims=0))
