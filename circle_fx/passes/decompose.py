"""Rewrite composite aten norm ops into what the emitter knows.

``torch.nn.RMSNorm`` / ``F.rms_norm`` export as one ``aten.rms_norm.default`` node, not as
the decomposed ``pow -> mean -> rsqrt`` chain the fusion patterns look for. Normalising
over the last axis only is exactly ``circle.rms_norm``, so it becomes that op directly;
normalising over several trailing axes has no Circle counterpart and is spelled out in
primitive aten ops instead (which the emitter lowers one by one).

Semantics follow torch's own decomposition (``_fused_rms_norm``): compute in at least
float32, ``eps=None`` means ``finfo(compute dtype).eps``, result in the input dtype.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import arguments, dtype_of, make_node, shape_of
from .base import Pass

aten = torch.ops.aten


def _rms_norm_to_circle(n: fx.Node, g: fx.Graph) -> fx.Node | None:
    from ..ops import rms_norm

    x, normalized_shape, weight, eps = arguments(n)[:4]
    xdt, shape = dtype_of(x), shape_of(x)
    if xdt is None or not xdt.is_floating_point or shape is None or not normalized_shape:
        return None
    compute = torch.promote_types(xdt, torch.float32)
    eps = float(torch.finfo(compute).eps if eps is None else eps)
    k = len(normalized_shape)
    if k == 1:
        return make_node(g, rms_norm, (x, weight, eps), like=n)
    xf = x if compute == xdt else make_node(g, aten._to_copy.default, (x,), {"dtype": compute}, like=n)
    dims = [len(shape) - 1 - i for i in range(k)]
    var = make_node(g, aten.mean.dim, (make_node(g, aten.pow.Tensor_Scalar, (xf, 2), like=n), dims, True), like=n)
    scale = make_node(g, aten.rsqrt.default, (make_node(g, aten.add.Tensor, (var, eps), like=n),), like=n)
    y = make_node(g, aten.mul.Tensor, (xf, scale), like=n)
    if weight is not None:
        y = make_node(g, aten.mul.Tensor, (y, weight), like=n)
    if dtype_of(y) != xdt:
        y = make_node(g, aten._to_copy.default, (y,), {"dtype": xdt}, like=n)
    return y


#: aten op -> rewrite returning the replacement node (or None to leave the node alone)
RULES = {aten.rms_norm.default: _rms_norm_to_circle}


class DecomposeComposites(Pass):
    """Replace composite ops (``aten.rms_norm``) by Circle ops or primitive aten ops."""

    name = "decompose"

    def run(self, program) -> bool:
        g = program.gm.graph
        changed = False
        for n in list(g.nodes):
            rule = RULES.get(n.target) if n.op == "call_function" else None
            if rule is None:
                continue
            with g.inserting_before(n):
                new = rule(n, g)
            if new is not None:
                n.replace_all_uses_with(new)
                g.erase_node(n)
                changed = True
        return changed
