"""Complex arithmetic -> real arithmetic on (real, imaginary) pairs.

Llama4-style rotary embeddings multiply ``view_as_complex(q.reshape(..., -1, 2))`` by
complex ``freqs_cis`` and read the result back with ``view_as_real``. Circle (and onert)
have no complex tensors, but the computation is plain real arithmetic on pairs:
``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``.

Every complex value that depends on a model input becomes two float tensors:
``view_as_complex(x)`` -> ``x[..., 0]`` and ``x[..., 1]``; complex ``mul``/``add``/``sub`` ->
their real formulas; ``polar(abs, angle)`` -> ``abs*cos(angle)``, ``abs*sin(angle)``; shape ops (view, unsqueeze, slice...) apply to both parts;
``view_as_real(z)`` -> ``stack([re, im], -1)``. Complex values that depend on no input
(the folded ``freqs_cis`` table) are split with ``aten.real`` / ``aten.imag``, which
constant folding evaluates. If any complex op outside this set depends on an input,
nothing is rewritten and the unsupported-op error names that op.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import input_dependent, make_node, val

aten = torch.ops.aten

#: ops applied to the real and imaginary parts alike (first argument is the complex tensor)
_SHAPE_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
              aten.squeeze.dim, aten.squeeze.dims, aten.expand.default, aten.permute.default,
              aten.transpose.int, aten.slice.Tensor, aten.select.int, aten.clone.default, aten.alias.default,
              aten.contiguous.default, aten.flatten.using_ints}
_ARITH = {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor}
_SUPPORTED = _SHAPE_OPS | _ARITH | {aten.view_as_complex.default, aten.view_as_real.default,
                                    aten._to_copy.default, aten.polar.default}


def _is_complex(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_complex()



def complex_to_real(program) -> bool:
    g = program.gm.graph
    live = input_dependent(g)
    todo = [n for n in g.nodes if n.op == "call_function" and n in live
            and (_is_complex(val(n)) or any(_is_complex(val(i)) for i in n.all_input_nodes))]
    if not todo or any(n.target not in _SUPPORTED for n in todo):
        return False
    if any(n.target is aten._to_copy.default and val(n).dtype != val(n.args[0]).dtype for n in todo):
        return False
    for n in todo:  # complex add/sub: both operands complex, no alpha
        if n.target in (aten.add.Tensor, aten.sub.Tensor) and (
                n.kwargs or len(n.args) != 2 or not all(isinstance(x, fx.Node) and _is_complex(val(x)) for x in n.args)):
            return False
        if n.target is aten.mul.Tensor and n.kwargs:
            return False
    parts: dict[fx.Node, tuple[fx.Node, fx.Node]] = {}

    def split(v, like):
        if v in parts:
            return parts[v]
        if isinstance(v, fx.Node) and _is_complex(val(v)):  # an input-free complex value (a constant)
            parts[v] = (make_node(g, aten.real.default, (v,), like=like), make_node(g, aten.imag.default, (v,), like=like))
            return parts[v]
        return None

    for n in todo:
        with g.inserting_before(n):
            t, a = n.target, n.args
            if t is aten.view_as_complex.default:
                parts[n] = tuple(make_node(g, aten.select.int, (a[0], -1, k), like=n) for k in (0, 1))
            elif t is aten.polar.default:  # abs * (cos + i sin) of a run-time angle (RoPE at a decode position)
                parts[n] = tuple(make_node(g, aten.mul.Tensor, (a[0], make_node(g, f, (a[1],), like=n)), like=n)
                                 for f in (aten.cos.default, aten.sin.default))
            elif t is aten.view_as_real.default:
                re, im = split(a[0], n)
                pair = [make_node(g, aten.unsqueeze.default, (p, -1), like=n) for p in (re, im)]
                n.replace_all_uses_with(make_node(g, aten.cat.default, (pair, -1), like=n))
            elif t is aten._to_copy.default:
                parts[n] = split(a[0], n)
            elif t in _SHAPE_OPS:
                re, im = split(a[0], n)
                parts[n] = tuple(make_node(g, t, (p, *a[1:]), dict(n.kwargs), like=n) for p in (re, im))
            else:
                parts[n] = _arith(g, n, split(a[0], n), split(a[1], n))
    return True


def _arith(g, n, x, y):
    a, b = n.args[0], n.args[1]

    def op(t, p, q):
        return make_node(g, t, (p, q), like=n)

    if n.target is aten.mul.Tensor:
        if x is not None and y is not None:
            return (op(aten.sub.Tensor, op(aten.mul.Tensor, x[0], y[0]), op(aten.mul.Tensor, x[1], y[1])),
                    op(aten.add.Tensor, op(aten.mul.Tensor, x[0], y[1]), op(aten.mul.Tensor, x[1], y[0])))
        (z, r) = (x, b) if x is not None else (y, a)
        return op(aten.mul.Tensor, z[0], r), op(aten.mul.Tensor, z[1], r)
    return op(n.target, x[0], y[0]), op(n.target, x[1], y[1])
