"""RoPE fusion family: HF's ``x*cos + rotate_half(x)*sin`` -> ``circle.rope(x, sin, cos)``
-> Circle's ROPE op (builtin -7, mode GPT_NEOX).

The pattern is transformers' ``apply_rotary_pos_emb`` with ``rotate_half(x) =
cat(-x[..., D/2:], x[..., :D/2])`` (GPT-NeoX layout, what onert's GPT_NEOX mode computes).

Fused only where onert's kernel is exact (shared matrix §1): it reads the first D
entries of the sin/cos tables and applies them to every position, so the tables must
hold ONE position (every dim but the last is 1: a decode step); ``x`` must be 4-D with
an even last dim. A prefill (several positions) keeps the decomposed form, so the family
is safe in the default pipeline: it changes only single-position graphs (``export_llm``'s
decode model, or any export with one token).
"""
from __future__ import annotations

import torch

from ..circle.limits import holds_several_positions
from ..circle.schema import BO, make_options
from ..fx_utils import dtype_of, make_node, shape_of
from ..dialect import define
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from .registry import FusionFamily, register_family


def _rope_eager(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX rotation (transformers' ``rotate_half``) in Circle ROPE's argument order (x, sin, cos)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rope_fake(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


#: ``torch.ops.circle.rope.default`` (lowered by :func:`lower_rope` below)
rope = define("rope(Tensor x, Tensor sin, Tensor cos) -> Tensor", _rope_eager, _rope_fake)

aten = torch.ops.aten



def rope_rotate_half(x, cos, sin, dim, half, end, step, cat_dim):
    rotated = aten.cat.default([aten.neg.default(aten.slice.Tensor(x, dim, half, end, step)),
                                aten.slice.Tensor(x, dim, 0, half, step)], cat_dim)
    return aten.add.Tensor(aten.mul.Tensor(x, cos), aten.mul.Tensor(rotated, sin))


# --------------------------------------------------------------------------- checks

def _last(axis, ndim) -> bool:
    return isinstance(axis, int) and axis % ndim == ndim - 1


def _check_x(m):
    shape, dt = shape_of(m["x"]), dtype_of(m["x"])
    if shape is None or any(not isinstance(d, int) for d in shape):
        return "x has a dynamic shape"
    if len(shape) != 4:
        return f"x is {len(shape)}-D; onert's ROPE takes 4-D inputs only"
    if dt != torch.float32:
        return f"x has dtype {dt}; onert's ROPE is float32"
    d = shape[-1]
    if d % 2:
        return f"head dim {d} is odd"
    if not (_last(m["dim"], 4) and _last(m["cat_dim"], 4)):
        return "the halves are not taken along the last axis"
    if m["step"] != 1 or m["half"] != d // 2 or not (isinstance(m["end"], int) and m["end"] >= d):
        return f"the slices are not x[..., :{d // 2}] and x[..., {d // 2}:]"
    return None


def _check_one_position(m):
    d = shape_of(m["x"])[-1]
    for name in ("cos", "sin"):
        s = shape_of(m[name])
        if s is None or any(not isinstance(k, int) for k in s) or len(s) > 4:
            return f"{name} has a dynamic shape or rank > 4"
        if not s or s[-1] != d or holds_several_positions(s) or dtype_of(m[name]) != torch.float32:
            return (f"{name} has shape {list(s)}: onert's ROPE is exact only for tables of one position "
                    f"([..., {d}] with every other dim 1; it applies row 0 to every position)")
    return None


def _replace(m, graph):
    return make_node(graph, rope, (m["x"], m["sin"], m["cos"]), like=m.root)


RULES = [Rewrite("rope_rotate_half", Pattern(rope_rotate_half), _replace, (_check_x, _check_one_position),
                 produces="rope")]


#: RoPEOptions.mode of the rotate-half (``x * cos + rotate_half(x) * sin``) form
GPT_NEOX = 0


def lower_rope(ctx, node):
    """``circle.rope(x, sin, cos)`` -> Circle ROPE (builtin -7), mode GPT_NEOX.

    onert wants 4-D tables whose last dim is the head dim, in the input order (x, sin, cos),
    and a RoPEOptions table (without it the kernel segfaults): tables of one position become
    ``[1, 1, 1, D]``, others get leading 1s up to rank 4. onert applies the first row to every
    position; the rule above creates this op for single-position tables only, and the
    ``rope_positions`` legalization step (``emit/legalize/forms.py``) decomposes any other."""
    x, sin, cos = node.args
    dt = ctx.dtype(x)
    d = ctx.dims(x, static=True)[-1]
    tables = []
    for name, t in (("sin", sin), ("cos", cos)):
        dims = ctx.dims(t, static=True)
        several = holds_several_positions(dims)
        if dims[-1] != d or len(dims) > 4 and several:
            raise ctx.error(f"{name} table {dims}: ROPE takes a table [..., {d}] of rank <= 4")
        want = [1] * (4 - len(dims)) + dims if several else [1, 1, 1, d]
        idx = ctx.operand(t, dt)
        if dims != want:
            r = ctx.new_tensor(want, dt, f"{name}4d")
            ctx.op(BO.RESHAPE, [idx, ctx.int_const(want)], [r])
            idx = r
        tables.append(idx)
    ctx.op(BO.ROPE, [ctx.tensor(x), *tables], [ctx.output(node)], make_options("RoPEOptions", mode=GPT_NEOX))


# No explain candidates: a multi-position RoPE (every prefill, every plain export) is
# *correctly* left decomposed, and listing each one as "not fused" would only be noise.
FAMILY = register_family(FusionFamily("rope", RULES, op=rope, lowering=lower_rope, title="RoPE", order=60))
