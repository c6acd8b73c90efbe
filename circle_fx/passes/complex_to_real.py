"""Complex arithmetic -> real arithmetic on (real, imaginary) pairs.

Llama4-style rotary embeddings multiply ``view_as_complex(q.reshape(..., -1, 2))`` by
complex ``freqs_cis`` and read the result back with ``view_as_real``. Circle (and onert)
have no complex tensors, but the computation is plain real arithmetic on pairs:
``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``.

Every complex value that depends on a model input becomes two float tensors:
``view_as_complex(x)`` -> ``x[..., 0]`` and ``x[..., 1]``; complex ``mul``/``add``/``sub`` ->
their real formulas; ``polar(abs, angle)`` -> ``abs*cos(angle)``, ``abs*sin(angle)``; shape ops (view, unsqueeze, slice...) apply to both parts;
``view_as_real(z)`` -> ``stack([re, im], -1)``, ``z.real`` / ``z.imag`` -> that part; a
discrete Fourier transform (``torch.fft.fft`` / ``fft2`` / ``fftn``: FNet's token mixing) -> one
matrix product per transformed dim with the constant cosine and sine matrices (``X W`` with
``W = C - iS``: ``re' = re C + im S``, ``im' = im C - re S``; a real input drops the ``im``
terms). That is O(N^2) per dim where an FFT is O(N log N), but it is what onert runs (a matrix
product per dim), and FNet's dims are small. Complex values that depend on no input
(the folded ``freqs_cis`` table) are split with ``aten.real`` / ``aten.imag``, which
constant folding evaluates. If any complex op outside this set depends on an input,
nothing is rewritten and the unsupported-op error names that op.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import input_dependent, make_node, val
from ..op_traits import ARITHMETIC, COMPLEX_PARTS, FFT, IDENTITY, VALUE_PRESERVING

aten = torch.ops.aten

#: ops applied to the real and imaginary parts alike (first argument is the complex tensor, the
#: others shapes, dims or indices): moves, selections and identities
_PARTWISE = VALUE_PRESERVING | IDENTITY
#: every op this pass rewrites: those, complex + - * (``_arith``), the DFTs (written as matrix
#: products: ``_dft``), the complex <-> real conversions and a same-dtype copy
_SUPPORTED = _PARTWISE | ARITHMETIC | FFT | COMPLEX_PARTS | {aten._to_copy.default}


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
        if n.target in FFT and _fft_dims(n) is None:
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
            elif t in (aten.real.default, aten.imag.default):  # ``z.real``: a float view of one part
                n.replace_all_uses_with(split(a[0], n)[t is aten.imag.default])
            elif t is aten._to_copy.default:
                parts[n] = split(a[0], n)
            elif t in FFT:
                parts[n] = _dft(program.gm, n, split(a[0], n) or (a[0], None))
            elif t in _PARTWISE:
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


def _fft_dims(n: fx.Node) -> tuple[list[int], float] | None:
    """(the transformed dims, the output scale) of an FFT node; None for a form not written
    here: a size ``n``/``s`` (padding or cropping first) or a dynamic transformed dim."""
    args = dict(zip((a.name for a in n.target._schema.arguments), n.args))
    args.update(n.kwargs)
    shape = val(n).shape
    if args.get("n") is not None or args.get("s") is not None:
        return None
    if n.target is aten.fft_fft.default:
        dims = [args.get("dim", -1)]
    elif n.target is aten.fft_fft2.default:
        dims = list(args.get("dim", (-2, -1)))
    else:
        dims = list(args["dim"]) if args.get("dim") is not None else list(range(len(shape)))
    dims = sorted({d % len(shape) for d in dims})
    if not all(isinstance(shape[d], int) for d in dims):
        return None
    size = 1
    for d in dims:
        size *= shape[d]
    scale = {None: 1.0, "backward": 1.0, "ortho": size ** -0.5, "forward": 1.0 / size}.get(args.get("norm"))
    return None if scale is None else (dims, scale)


def _dft(gm: fx.GraphModule, n: fx.Node, x) -> tuple[fx.Node, fx.Node]:
    """(re, im) of ``n``'s transform of ``x = (re, im)`` (``im`` None: a real input): per dim,
    the dim moved last, a product with the (symmetric) cosine / sine matrices, moved back."""
    from ..program import add_constant

    g = n.graph
    dims, scale = _fft_dims(n)
    re, im = x
    rank = len(val(n).shape)
    dtype = val(n).dtype.to_real()  # complex64 -> float32
    if val(re).dtype != dtype:  # an integer input: torch transforms it as float
        re = make_node(g, aten._to_copy.default, (re,), {"dtype": dtype}, like=n)

    def mm(t, m, d):
        last = t if d == rank - 1 else make_node(g, aten.transpose.int, (t, d, rank - 1), like=n)
        y = make_node(g, aten.matmul.default, (last, m), like=n)
        return y if d == rank - 1 else make_node(g, aten.transpose.int, (y, d, rank - 1), like=n)

    for j, d in enumerate(dims):
        size = val(n).shape[d]
        k = torch.arange(size, dtype=torch.int64)
        angle = (k[:, None] * k[None, :] % size).double() * (2 * torch.pi / size)
        f = scale if j == 0 else 1.0  # the norm's scale once, folded into the first dim's matrices
        mats = []
        for fn in (torch.cos, torch.sin):
            t = (fn(angle) * f).to(dtype)
            c = g.get_attr(add_constant(gm, t, f"{n.name}_dft_{fn.__name__}{d}"))
            c.meta["val"] = t
            mats.append(c)
        cos, sin = mats
        if im is None:
            re, im = mm(re, cos, d), make_node(g, aten.neg.default, (mm(re, sin, d),), like=n)
        else:
            re, im = (make_node(g, aten.add.Tensor, (mm(re, cos, d), mm(im, sin, d)), like=n),
                      make_node(g, aten.sub.Tensor, (mm(im, cos, d), mm(re, sin, d)), like=n))
    return re, im
