"""circle_fx's own decompositions, for ops torch's tables leave whole (or decompose into ops
onert 0.1.0 lacks). Consulted first by :mod:`circle_fx.passes.decompose_unlowered`.

Each is plain torch code on static shapes, traced with ``make_fx``; every op it produces
must itself have a lowering (or depend on no input, and fold to a constant).

- ``gather`` / ``scatter`` along a dim: onert 0.1.0 has no GATHER_ND / SCATTER_ND, so they
  are written as a one-hot comparison against ``arange`` (a constant) plus a select and a
  sum. Exact (``where`` picks values, the sum adds zeros), also for infinities; costs
  ``index.numel() * size(dim)`` elements, fine for routers and small index sets. Inputs of
  rank >= 4 are flattened to ``[before, dim, after]`` first, since the one-hot adds an axis
  and onert 0.1.0 reduces at most 4-D tensors (Inkling's 4-D relative-logit gather).
- ``*_like`` / ``new_*`` factories: the result depends only on the (static) shape, so they
  become ``full`` (a constant after folding); ``empty`` variants are zeros.
- ``copy(x, src)``: the value is ``src`` cast and broadcast to ``x``'s shape.
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _one_hot(index: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``index`` with a new axis after ``dim``: True where ``index == j`` for position ``j``."""
    shape = [1] * (index.dim() + 1)
    shape[dim + 1] = size
    positions = torch.arange(size, dtype=index.dtype).reshape(shape)
    return index.unsqueeze(dim + 1) == positions


def _flat3(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as ``[prod(before dim), size(dim), prod(after dim)]``: the one-hot then adds one
    axis, and the select/sum run on at most 4-D tensors (onert 0.1.0's SUM / MEAN refuse
    5-D input: "ShapeValidator failed at line 304", docs/onert-findings.md)."""
    return t.reshape(math.prod(t.shape[:dim]), t.shape[dim], math.prod(t.shape[dim + 1:]))


def gather(x, dim, index, sparse_grad=False):
    dim %= max(x.dim(), 1)
    n = x.shape[dim]
    if index.shape[:dim] != x.shape[:dim] or index.shape[dim + 1:] != x.shape[dim + 1:]:
        for d in range(x.dim()):
            if d != dim and index.shape[d] != x.shape[d]:
                x = x.narrow(d, 0, index.shape[d])
    if x.dim() >= 4:  # same values on [pre, n, post] / [pre, m, post]
        return gather(_flat3(x, dim), 1, _flat3(index, dim)).reshape(index.shape)
    hot = _one_hot(index, dim, n)                           # [..., m, n, ...]
    picked = torch.where(hot, x.unsqueeze(dim), torch.zeros((), dtype=x.dtype))
    return picked.sum(dim + 1)


def _scatter(x, dim, index, src):
    """``scatter`` along ``dim`` with an index as large as ``x`` in the other dims. A scalar
    value is selected (exact, duplicates included); a source tensor is picked by a sum over
    the one-hot (torch leaves duplicate indices undefined; topk indices have none), in
    float32 for non-float tensors (exact below 2**24)."""
    dim %= max(x.dim(), 1)
    n = x.shape[dim]
    if any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        raise NotImplementedError("scatter with an index smaller than self outside dim")
    if isinstance(src, torch.Tensor):  # only src's leading [*index.shape] block is used
        for d in range(src.dim()):
            if src.shape[d] != index.shape[d]:
                src = src.narrow(d, 0, index.shape[d])
    if x.dim() >= 4:  # same values on [pre, n, post] (see _flat3)
        src3 = _flat3(src, dim) if isinstance(src, torch.Tensor) else src
        return _scatter(_flat3(x, dim), 1, _flat3(index, dim), src3).reshape(x.shape)
    hot = _one_hot(index, dim, n)                           # [..., m, n, ...]
    hit = hot.to(torch.float32).sum(dim) > 0                # [..., n, ...]: counts are exact in float
    if not isinstance(src, torch.Tensor):
        if x.dtype == torch.bool:  # onert 0.1.0's SELECT_V2 has no bool kernel: logical ops
            return torch.logical_or(x, hit) if src else torch.logical_and(x, torch.logical_not(hit))
        return torch.where(hit, torch.full((), src, dtype=x.dtype), x)
    acc = x.dtype if x.is_floating_point() else torch.float32
    vals = torch.where(hot, src.to(acc).unsqueeze(dim + 1), torch.zeros((), dtype=acc)).sum(dim)
    return torch.where(hit, vals.to(x.dtype), x)


def scatter_src(x, dim, index, src):
    return _scatter(x, dim, index, src)


def scatter_value(x, dim, index, value):
    return _scatter(x, dim, index, value)


def _factory(fill):
    def like(x, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, **kw):
        value = fill(args) if callable(fill) else fill
        return torch.full(x.shape, value, dtype=dtype or x.dtype)
    return like


def _new(fill):
    def new(x, size, *args, dtype=None, layout=None, device=None, pin_memory=None, **kw):
        value = fill(args) if callable(fill) else fill
        return torch.full(list(size), value, dtype=dtype or x.dtype)
    return new


def copy(x, src, non_blocking=False):
    return src.to(x.dtype).expand(x.shape).clone()


def expm1(x):
    # exp(x) - 1: absolute error ~1 ulp of 1 near 0 (relative precision of tiny results is lost)
    return torch.exp(x) - 1


def var_mean(x, dim=None, *, correction=None, keepdim=False):
    dims = list(range(x.dim())) if dim is None else [d % max(x.dim(), 1) for d in dim]
    count = 1
    for d in dims:
        count *= x.shape[d]
    correction = 1 if correction is None else correction
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).pow(2).sum(dims, keepdim=keepdim) / max(count - correction, 0)
    return var, (mean if keepdim else mean.squeeze(dims))


def var(x, dim=None, *, correction=None, keepdim=False):
    return var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The 2-norm of a real float tensor as ``sqrt(sum(x**2))``, the form the norm
    canonicalization (``canonicalize_norms``) reads; other norms: torch's own table."""
    if ord != 2 or dtype is not None or not x.is_floating_point():
        return NotImplemented
    dims = list(range(x.dim())) if dim is None else list(dim)
    return torch.sqrt(torch.sum(x.pow(2), dims, keepdim=keepdim))


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """1-D convolution (``conv1d``: LFM2's short causal conv, Mamba-style blocks, ZAYA's
    per-head q/k conv) as a sum over the kernel taps of shifted slices: depthwise
    (``groups == channels``) taps are a per-channel MUL, ``groups == 1`` taps a matmul, other
    group counts one batched matmul per tap over the groups. Kernels are a handful of taps, so
    this is K small ops; 2-D is left to a future CONV_2D lowering."""
    if transposed or x.dim() != 3 or len(stride) != 1:
        return NotImplemented
    c_in, c_out, k = x.shape[1], weight.shape[0], weight.shape[2]
    if c_in % groups or c_out % groups:
        return NotImplemented
    depthwise = groups == c_in and c_out == c_in
    s, p, d = stride[0], padding[0], dilation[0]
    if p:
        x = torch.nn.functional.pad(x, (p, p))
    length = (x.shape[2] - d * (k - 1) - 1) // s + 1
    xt = x.transpose(1, 2)                                                       # [B, L, C_in]
    out = None
    for tap in range(k):
        xs = xt[:, tap * d: tap * d + s * (length - 1) + 1: s]                    # [B, L_out, C_in]
        if groups == 1:
            term = torch.nn.functional.linear(xs, weight[:, :, tap])               # FULLY_CONNECTED
        elif depthwise:
            term = xs * weight[:, 0, tap]
        else:
            term = _grouped_tap(xs, weight[:, :, tap], groups)
        out = term if out is None else out + term
    if bias is not None:
        out = out + bias
    return out.transpose(1, 2)


def _grouped_tap(xs, w, groups):
    """One tap of a grouped convolution: ``xs`` [B, L, G*Ci] times the tap's weight
    [G*Co, Ci], group by group, as one BATCH_MATMUL [B, G, L, Ci] x [G, Ci, Co]."""
    b, n, c_in = xs.shape
    co = w.shape[0] // groups
    xg = xs.reshape(b, n, groups, c_in // groups).transpose(1, 2)                # [B, G, L, Ci]
    wg = w.reshape(groups, co, c_in // groups).transpose(1, 2)                   # [G, Ci, Co]
    return torch.matmul(xg, wg).transpose(1, 2).reshape(b, n, groups * co)      # [B, L, G*Co]


def repeat(x, repeats):
    """``repeat`` as one CONCATENATION per repeated dim. torch's decomposition expands to
    ``2 * rank`` dims and permutes; onert 0.1.0 crashes or computes garbage on those rank-8
    TRANSPOSE / BROADCAST_TO ops (DiffLlama's ``v.repeat(1, 2, 1, 1)``: segfault, or max diff
    0.97), so the rank stays that of the result here."""
    extra = len(repeats) - x.dim()
    if extra:
        x = x.reshape([1] * extra + list(x.shape))
    for d, r in enumerate(repeats):
        if r != 1:
            x = torch.cat([x] * r, d)
    return x


def log1p(x):
    # log(1 + x): exact to ~1e-7 absolute; softplus = log1p(exp(x)) only needs that
    return torch.log(x + 1)


def flip(x, dims):
    """``flip`` as a GATHER per flipped dim with constant reversed indices."""
    for dim in dims:
        n = x.shape[dim]
        x = torch.index_select(x, dim, torch.arange(n - 1, -1, -1))
    return x


DECOMPOSITIONS = {
    aten.repeat.default: repeat,
    aten.log1p.default: log1p,
    aten.flip.default: flip,
    aten.convolution.default: convolution,
    aten.linalg_vector_norm.default: vector_norm,
    aten.expm1.default: expm1,
    aten.var_mean.correction: var_mean,
    aten.var.correction: var,
    aten.gather.default: gather,
    aten.scatter.src: scatter_src,
    aten.scatter.value: scatter_value,
    aten.full_like.default: _factory(lambda a: a[0]),
    aten.zeros_like.default: _factory(0),
    aten.ones_like.default: _factory(1),
    aten.empty_like.default: _factory(0),
    aten.new_empty.default: _new(0),
    aten.new_zeros.default: _new(0),
    aten.new_ones.default: _new(1),
    aten.new_full.default: _new(lambda a: a[0]),
    aten.copy.default: copy,
    aten.min.other: lambda a, b: torch.minimum(a, b),
    aten.max.other: lambda a, b: torch.maximum(a, b),
}
