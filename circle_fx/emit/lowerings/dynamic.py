"""Sizes of dynamic dims (``aten.sym_size.int``) as they appear in a dynamic-shape graph.

With ``dynamic_shapes``, ``x.reshape(b, x.shape[1], h, d)`` records the run-time length as
a ``sym_size`` node feeding the reshape. Lowerings take shapes from the node's own
metadata (dynamic dims become -1 in RESHAPE), so the size itself needs no tensor. A
lowering that does ask for it as a tensor gets a clear error from ``ctx.tensor``.
"""
from __future__ import annotations

import torch

from ..registry import lowering

aten = torch.ops.aten


@lowering(aten.sym_size.int)
def sym_size(ctx, node):
    """Nothing to emit: consumers read dynamic dims from shape metadata."""
