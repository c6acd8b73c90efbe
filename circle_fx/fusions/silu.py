"""SiLU written by hand, ``x * sigmoid(x)`` -> ``circle.silu(x)`` -> Circle's fastest SiLU form.

The whole fusion is this file: the op (with its traits), the rule, the lowering, the order.
Models that write the swish out (``x * torch.sigmoid(x)``) instead of ``F.silu`` export as
LOGISTIC + MUL; onert runs the same function as ``h + h * tanh(h)``, ``h = x / 2``, 22 %
faster (``benchmarks/silu_forms.py``: 0.270 vs 0.345 ms on [1, 128, 1536], max diff to eager
1.9e-6), so ``circle.silu`` is lowered to MUL, TANH, MUL, ADD.

The op is declared ``elementwise``: the layout pass moves a CNN's NHWC permutes through it like
through the LOGISTIC and MUL it replaces, so a swish between two convolutions still costs two
TRANSPOSEs, not four (tests/fusions/test_silu.py).

Check (named, for ``explain``): ``x`` is float32 (onert's TANH kernel).
"""
from __future__ import annotations

import torch

from ..circle.schema import BO, make_options
from ..dialect import define
from ..fx_utils import dtype_of, make_node
from ..op_traits import ELEMENTWISE
from ..patterns import Pattern, Rewrite
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten

silu = define("silu(Tensor x) -> Tensor", lambda x: x * torch.sigmoid(x), lambda x: torch.empty_like(x),
              traits=(ELEMENTWISE,))


def swish(x):
    return aten.mul.Tensor(x, aten.sigmoid.default(x))  # mul is matched in either order


def _check_float32(m):
    dt = dtype_of(m["x"])
    return None if dt == torch.float32 else f"x is {dt}; onert's TANH is float32"


def _replace(m, graph):
    return make_node(graph, silu, (m["x"],), like=m.root)


def lower_silu(ctx, node):
    """``h + h * tanh(h)`` with ``h = x * 0.5``."""
    half = ctx.like(node, "half")
    ctx.op(BO.MUL, [ctx.tensor(node.args[0]), ctx.tensor(0.5, torch.float32)], [half], make_options("MulOptions"))
    tanh = ctx.like(node, "tanh")
    ctx.op(BO.TANH, [half], [tanh])
    scaled = ctx.like(node, "half_tanh")
    ctx.op(BO.MUL, [half, tanh], [scaled], make_options("MulOptions"))
    ctx.op(BO.ADD, [half, scaled], [ctx.output(node)], make_options("AddOptions"))


FAMILY = register_family(FusionFamily(
    "silu", [Rewrite("swish", Pattern(swish), _replace, (_check_float32,), produces="silu")], op=silu,
    lowering=lower_silu, order=70, title="SiLU",
    candidates=(Candidate(lambda n: n.target is aten.sigmoid.default, hops=1, require_check=True),)))
