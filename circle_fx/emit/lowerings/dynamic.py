"""Sizes of dynamic dims (``aten.sym_size.int``) as they appear in a dynamic-shape graph.

With ``dynamic_shapes``, ``x.reshape(b, x.shape[1], h, d)`` records the run-time length as
a ``sym_size`` node feeding the reshape. Lowerings take shapes from the node's own
metadata (dynamic dims become -1 in RESHAPE), so the size itself needs no tensor. A
lowering that does ask for it as a tensor gets a clear error from ``ctx.tensor``.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ...fx_utils import val
from ...source import op_name
from ..registry import lowering
from ..types import numpy_dtype

aten = torch.ops.aten


@lowering(aten.sym_size.int, operator.add, operator.mul)
def sym_size(ctx, node):
    """Nothing to emit: consumers read dynamic dims (and sums of them, as in
    ``arange(3, x.shape[1] + 3)``) from shape metadata."""
    if not isinstance(val(node), torch.SymInt):
        raise ctx.error(f"{op_name(node.target)} of {node.args} is not arithmetic on sizes")


@lowering(aten.new_ones.default, aten.new_zeros.default, aten.new_full.default)
def new_filled(ctx, node):
    """A constant of static size made "like" a tensor (``mask.new_ones(())``): only the
    source's dtype and device are used, so a dynamic source does not matter. (Constant
    folding skips it because its argument is computed at run time.)"""
    size = list(node.args[1])
    if not all(isinstance(d, int) for d in size):
        raise ctx.error(f"{op_name(node.target)} of dynamic size {size} is not supported")
    fill = {aten.new_ones.default: 1, aten.new_zeros.default: 0}.get(node.target)
    fill = node.args[2] if fill is None else fill
    ctx.bind(node, ctx.const(np.full(size, fill, dtype=numpy_dtype(ctx.dtype(node))), "filled"))
