"""circle_fx's own decompositions, for ops torch's tables leave whole (or decompose into ops
onert 0.1.0 lacks). Consulted first by :mod:`circle_fx.passes.decompose_unlowered`.

Each is plain torch code on static shapes, traced with ``make_fx``; every op it produces
must itself have a lowering (or depend on no input, and fold to a constant).

- ``gather`` / ``scatter`` along a dim: onert 0.1.0 has no GATHER_ND / SCATTER_ND, so they
  are written (unless ``x`` is a single row: one GATHER) as a one-hot comparison against ``arange`` (a constant) plus a select and a
  sum. Exact (``where`` picks values, the sum adds zeros), also for infinities; costs
  ``index.numel() * size(dim)`` elements, fine for routers and small index sets. Inputs of
  rank >= 4 are flattened to ``[before, dim, after]`` first, since the one-hot adds an axis
  and onert 0.1.0 reduces at most 4-D tensors (Inkling's 4-D relative-logit gather).
- ``*_like`` / ``new_*`` factories: the result depends only on the (static) shape, so they
  become ``full`` (a constant after folding); ``empty`` variants are zeros.
- ``copy(x, src)``: the value is ``src`` cast and broadcast to ``x``'s shape.

:data:`REFUSED_FORMS` covers ops that *have* a lowering but not for some of their forms
(the lowering states which, once: ``@lowering(..., refuses=...)``: softmax over another axis
than the last, a sum with an int64 result, a crop). A refused node is decomposed like an op
without a lowering, into forms that lower and run, when its decomposition is exact for it. (Element types onert's data-movement kernels lack, bool slices and
cats included, are handled after lowering: ``emit/legalize/types.py``.)
"""
from __future__ import annotations

import math

import torch

from ..circle.dims import around
from ..layout.decompositions import DECOMPOSITIONS as NHWC_DECOMPOSITIONS
from ..layout.decompositions import _pair

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
    return t.reshape(around(t.shape, dim))


def gather(x, dim, index, sparse_grad=False):
    dim %= max(x.dim(), 1)
    n = x.shape[dim]
    if all(s == 1 for d, s in enumerate(x.shape) if d != dim):
        # one row to read from (RoBERTa's buffered token type ids ``[1, max_len]``): a plain
        # GATHER of the flattened row, any dtype (int64 constant tables go through int32)
        return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)
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


def _arg(reduce):
    def arg(x, dim=None, keepdim=False):
        """``argmax`` / ``argmin`` as the index output of ``max.dim`` / ``min.dim`` (ARG_MAX, which
        picks the first index on ties, as torch does); ``dim=None`` reads the flattened tensor."""
        if dim is None:
            index = reduce(x.reshape(-1), 0)[1]
            return index.reshape([1] * x.dim()) if keepdim else index
        return reduce(x, dim, keepdim)[1]
    return arg


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


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """``[N, C, *]`` normalized per (sample, group of ``C / G`` channels) over the group's channels
    and positions: a reshape to ``[N, G, C/G, positions]``, mean and biased variance over the
    last two axes (two passes, as torch computes it), the affine per channel. Exact to float
    rounding. The view keeps ``C/G`` and the positions apart, so on a channels-last map (after a
    convolution) the layout pass moves its permute through: ``[N, H*W, G, C/G]`` reduced over
    axes 1 and 3, with no TRANSPOSE (BiT, PoolFormer, wav2vec2's feature encoder)."""
    n, c = x.shape[0], x.shape[1]
    rest = list(x.shape[2:])
    g = x.reshape(n, num_groups, c // num_groups, -1)
    mean = g.mean((2, 3), keepdim=True)
    centered = g - mean
    var = (centered * centered).mean((2, 3), keepdim=True)
    y = (centered * torch.rsqrt(var + eps)).reshape(n, c, *rest)
    shape = [1, c] + [1] * len(rest)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The 2-norm of a real float tensor as ``sqrt(sum(x**2))``, the form the norm
    canonicalization (the RMSNorm family's spellings) reads; other norms: torch's own table."""
    if ord != 2 or dtype is not None or not x.is_floating_point():
        return NotImplemented
    dims = list(range(x.dim())) if dim is None else list(dim)
    return torch.sqrt(torch.sum(x.pow(2), dims, keepdim=keepdim))


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


def unfold(x, dim, size, step):
    """``x.unfold(dim, size, step)`` (sliding windows: Inkling2's short convolution reads
    ``context.unfold(-1, K, 1)``) as one GATHER of the window positions along ``dim`` (a
    constant index), a RESHAPE to ``[..., windows, size, ...]`` and a move of the window
    axis to the end, where torch puts it. Exact: values are only moved."""
    if x.dim() == 0:
        return NotImplemented
    d = dim % x.dim()
    n = (x.shape[d] - size) // step + 1
    index = (torch.arange(n).unsqueeze(1) * step + torch.arange(size)).reshape(-1)
    windows = torch.index_select(x, d, index).reshape(*x.shape[:d], n, size, *x.shape[d + 1:])
    return windows.movedim(d + 1, -1)


def col2im(x, output_size, kernel_size, dilation, padding, stride):
    """``fold`` of non-overlapping patches (kernel = stride, no padding or dilation, the
    patches tiling the output: MobileViTV2's folding of its unfolded patches) only moves
    values: ``[N, C*kh*kw, nh*nw]`` -> ``[N, C, nh, kh, nw, kw]`` -> ``[N, C, H, W]``. Other
    forms sum overlapping patches and stay unsupported."""
    k, s, d, p = _pair(kernel_size), _pair(stride), _pair(dilation), _pair(padding)
    h, w = _pair(output_size)
    if k != s or d != [1, 1] or p != [0, 0] or h % k[0] or w % k[1] or x.dim() not in (2, 3):
        return NotImplemented
    batched = x.dim() == 3
    x = x if batched else x.unsqueeze(0)
    n, nh, nw = x.shape[0], h // k[0], w // k[1]
    c = x.shape[1] // (k[0] * k[1])
    # [N*C, kh, kw, nh, nw] -> [N*C, nh, kh, nw, kw]: a rank-5 TRANSPOSE
    y = x.reshape(n * c, k[0], k[1], nh, nw).permute(0, 3, 1, 4, 2).reshape(n, c, h, w)
    return y if batched else y.squeeze(0)


#: Abramowitz & Stegun 7.1.26: erf(a) = 1 - t * P(t) * exp(-a*a), t = 1 / (1 + p*a), a >= 0
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)
#: erf's Maclaurin series, 2/sqrt(pi) * sum (-1)^n a^(2n+1) / (n! (2n+1)), to n = 6 (below
#: 1e-9 relative for a < 0.5), highest power first
_ERF_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) * 2 / math.sqrt(math.pi) for n in range(6, -1, -1))


def erf(x):
    """``erf`` from EXP, DIV and polynomials (Circle has no ERF operator; SEW-D's and
    ESM's hand-written GELU ``0.5 * x * (1 + erf(x / sqrt(2)))`` use it). For ``|x| >= 0.5``
    the A&S formula (bound 1.5e-7 absolute); below, where ``1 - ...`` would cancel to a 24 %
    relative error near 0 in float32, the series. Measured 3e-7 absolute against float64 over
    [-6, 6] (tests/passes/test_decomposed_ops.py). Odd: computed on ``|x|``, the sign restored."""
    a = x.abs()
    t = 1.0 / (1.0 + _ERF_P * a)
    poly = torch.zeros_like(a)
    for c in _ERF_A:
        poly = (poly + c) * t
    far = 1.0 - poly * torch.exp(-a * a)
    a2 = a * a
    series = torch.zeros_like(a)
    for c in _ERF_SERIES:
        series = series * a2 + c
    y = torch.where(a < 0.5, series * a, far)
    return torch.where(x < 0, -y, y)


#: Abramowitz & Stegun 4.4.46: acos(a) = sqrt(1 - a) * P(a) for 0 <= a <= 1, |error| <= 2e-8
_ACOS_A = (-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
           -0.2145988016, 1.5707963050)


def acos(x):
    """``acos`` from SQRT and a polynomial (onert 0.1.0 has no ATAN2: "Unsupported
    operation: ATAN2", so not ``atan2(sqrt(1 - x*x), x)``); ``acos(-a) = pi - acos(a)``.
    Outside [-1, 1] the SQRT of a negative number is NaN, as torch's result is."""
    a = x.abs()
    poly = torch.zeros_like(a)
    for c in _ACOS_A:
        poly = poly * a + c
    y = torch.sqrt(1.0 - a) * poly
    return torch.where(x < 0, math.pi - y, y)


#: asin's Maclaurin series, sum (2n)! / (4^n (n!)^2 (2n+1)) a^(2n+1), to n = 9 (below 2e-8
#: relative for a < 0.5), highest power first
_ASIN_SERIES = tuple(math.factorial(2 * n) / (4 ** n * math.factorial(n) ** 2 * (2 * n + 1)) for n in range(9, -1, -1))


def asin(x):
    """``pi/2 - acos(x)``, except below ``|x| = 0.5`` where that difference cancels (``asin(1e-5)``
    would be 1.3 % off in float32): there the odd series, as :func:`erf` does."""
    a = x.abs()
    a2 = a * a
    series = torch.zeros_like(a)
    for c in _ASIN_SERIES:
        series = series * a2 + c
    y = torch.where(a < 0.5, series * a, math.pi / 2 - acos(a))
    return torch.where(x < 0, -y, y)


def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``src`` written over ``x[start:end]`` along ``dim`` (``shifted[:, 1:] = ids[:, :-1]``,
    BART's ``shift_tokens_right``), step 1: the kept ends of ``x`` and ``src`` concatenated.
    torch's decomposition GATHERs ``src`` by a clamped index, and onert 0.1.0 has no int64
    GATHER (the ids are int64); CONCATENATION runs int64 and only moves values. Other steps:
    torch's decomposition."""
    if step != 1:
        from torch._decomp import decomposition_table

        return decomposition_table[aten.slice_scatter.default](x, src, dim, start, end, step)
    d = dim % max(x.dim(), 1)
    n = x.shape[d]
    lo = 0 if start is None else min(max(start + n if start < 0 else start, 0), n)
    hi = n if end is None else min(max(end + n if end < 0 else end, lo), n)
    parts = ([x.narrow(d, 0, lo)] if lo else []) + [src.to(x.dtype)] + ([x.narrow(d, hi, n - hi)] if hi < n else [])
    return torch.cat(parts, d) if len(parts) > 1 else parts[0].clone()


def index_put(x, indices, values, accumulate=False):
    """``x[mask] = values`` (``+=`` with ``accumulate``) for one boolean mask whose values
    broadcast over the selected positions (Granite Speech's ``ids[is_audio] = 0``, T5Gemma 2's
    ``embeds[ids == eoi] = eoi_embedding``): ``where(mask, values, x)``, the mask given
    trailing unit axes. Exact (``where`` only picks). torch's decomposition goes through
    ``nonzero``, a data-dependent shape onert cannot run. Values with one row per selected
    position (their count is known only at run time: X-MOD's per-language adapters) and
    integer indices are refused: the op stays whole and the error names it."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or given[0][1].dtype not in (torch.bool, torch.uint8):
        raise NotImplementedError("index_put: only a single boolean mask is decomposed")
    p, mask = given[0]
    mask = mask.bool()
    rest = list(x.shape[p + mask.dim():])
    k = len(rest)
    vshape = list(values.shape)
    if len(vshape) > k:
        if vshape[len(vshape) - k - 1] != 1:
            raise NotImplementedError("index_put: one value row per selected position")
        head, tail = vshape[:len(vshape) - k - 1], vshape[len(vshape) - k:]
        if len(head) > p:
            raise NotImplementedError("index_put: values of a higher rank than the target")
    else:
        head, tail = [], vshape
    v = values.reshape(head + [1] * mask.dim() + tail)
    m = mask.reshape([1] * p + list(mask.shape) + [1] * k)
    new = (x + v).to(x.dtype) if accumulate else v.to(x.dtype)
    return torch.where(m, new, x)


def pad(x, pad, mode="constant", value=None):
    """``F.pad(mode="circular")`` (periodic boundaries): each padded dim, from the last, is the
    wrapped-around end slices concatenated around it (so corners wrap in both dims, as torch's).
    Exact: values are only moved. Other modes: torch's own decomposition."""
    if mode != "circular":
        return aten.pad.default.decompose(x, pad, mode, value)
    if any(p < 0 for p in pad):
        raise NotImplementedError("circular padding with a negative amount")
    for i in range(len(pad) // 2):
        d = x.dim() - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = x.shape[d]
        parts = ([x.narrow(d, n - lo, lo)] if lo else []) + [x] + ([x.narrow(d, 0, hi)] if hi else [])
        x = torch.cat(parts, d) if len(parts) > 1 else x
    return x


def _softmax_on_last_axis(fn):
    """``softmax`` / ``log_softmax`` over any axis: onert's SOFTMAX reduces the last axis,
    so the axis is moved there and back (two TRANSPOSEs); a dtype change (``dtype=`` or
    ``half_to_float``) becomes a cast of the input, which is what torch computes."""
    def decomposed(x, dim, dtype=None):
        if isinstance(dtype, torch.dtype):
            x = x.to(dtype)
        elif dtype is True:
            x = x.float()
        d = dim % max(x.dim(), 1)
        if d == x.dim() - 1:
            return fn(x, -1)
        # contiguous: later ``view``s of the result (eager runs of the graph) need torch's strides
        return fn(x.transpose(d, -1), -1).transpose(d, -1).contiguous()
    return decomposed


#: integer dtypes torch promotes to int64 in a sum, with their largest magnitude
_SMALL_INTS = {torch.bool: 1, torch.uint8: 255, torch.int8: 128, torch.int16: 1 << 15}


def _sum_in_int32(x, dim=None, keepdim=False, *, dtype=None):
    """A sum with an int64 result of a bool or small-integer tensor (``(ids != pad).sum(-1)``:
    a count) as an int32 SUM cast to int64. onert 0.1.0 has no int64 SUM kernel; int32 is
    exact because :func:`_narrow_sum` only admits sums whose bound fits in int32."""
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else list(dim)
    return x.to(torch.int32).sum(dims, keepdim, dtype=torch.int32).to(torch.int64)


def _narrow_sum(node) -> bool:
    """An int64-result sum (which the lowering refuses) that :func:`_sum_in_int32` computes exactly: every term is at most
    ``_SMALL_INTS[dtype]`` in magnitude and there are few enough of them."""
    x, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dtype != torch.int64:
        return False
    if x.dtype not in _SMALL_INTS or not all(isinstance(d, int) for d in x.shape):
        return False
    terms = max(x.numel(), 1) // max(out.numel(), 1)
    return terms * _SMALL_INTS[x.dtype] < 2**31


def _flags(a) -> bool:
    """``a`` (an operand node or number) holds only 0 and 1: a bool tensor, a bool cast to
    another dtype, or a constant whose values are all 0 or 1."""
    from ..op_traits import CAST
    from ..program import fetch_attr

    if isinstance(a, (bool, int)):
        return a in (0, 1)
    v = a.meta.get("val") if hasattr(a, "meta") else None
    if not isinstance(v, torch.Tensor):
        return False
    if v.dtype == torch.bool:
        return True
    if a.op == "call_function" and a.target in CAST:
        src = a.args[0].meta.get("val") if hasattr(a.args[0], "meta") else None
        return isinstance(src, torch.Tensor) and src.dtype == torch.bool
    if a.op == "get_attr":
        t = fetch_attr(a.graph.owning_module, a.target)
        return bool(((t == 0) | (t == 1)).all())
    return False


def _on_flags(node) -> bool:
    """An integer ``&`` / ``|`` whose operands are all 0/1 flags (CPM-Ant builds its mask as
    ``int32_context | bool_mask``): computed on bools, it is exact."""
    return all(_flags(a) for a in node.args[:2])


def _as_logical(fn):
    """``&`` / ``|`` of 0/1 flags, computed on bools and cast back: exact for flags."""
    def decomposed(a, b):
        dt = torch.result_type(a, b)
        a = a != 0 if isinstance(a, torch.Tensor) else bool(a)
        b = b != 0 if isinstance(b, torch.Tensor) else bool(b)
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        return fn(a, torch.full((), b) if not isinstance(b, torch.Tensor) else b).to(dt)
    return decomposed


def _crop_then_pad(x, pad, value=0.0):
    """The negative amounts as slices, then the positive ones as a constant pad: the same
    elements in the same places (a crop at one end and a pad at the other commute)."""
    grow = []
    for i in range(0, len(pad), 2):
        d = x.dim() - 1 - i // 2
        lo, hi = pad[i], pad[i + 1]
        x = x[(slice(None),) * d + (slice(max(-lo, 0), x.shape[d] - max(-hi, 0)),)]
        grow += [max(lo, 0), max(hi, 0)]
    return torch.constant_pad_nd(x, grow, value) if any(grow) else x.clone()


def _vector_weight(node) -> bool:
    w = node.args[1].meta.get("val") if hasattr(node.args[1], "meta") else None
    return isinstance(w, torch.Tensor) and w.dim() == 1


def _linear_one_row(x, w, b=None):
    """``F.linear`` with a 1-D weight: the weight as one row, then the unit last dim dropped
    (what torch returns). Exact: the same products and sum."""
    return torch.nn.functional.linear(x, w.unsqueeze(0), None if b is None else b.reshape(1)).squeeze(-1)


_softmax = _softmax_on_last_axis(torch.softmax)
_log_softmax = _softmax_on_last_axis(torch.log_softmax)

def _always(node) -> bool:
    return True


#: op -> (is the decomposition exact for this node?, decomposition into forms the lowering
#: takes), for nodes whose lowering refuses them (``@lowering(..., refuses=...)`` states why,
#: ``emit.registry.refusal`` asks)
REFUSED_FORMS = {
    aten.sum.dim_IntList: (_narrow_sum, _sum_in_int32),
    aten.sum.default: (_narrow_sum, lambda x, *, dtype=None: _sum_in_int32(x)),
    aten.softmax.int: (_always, _softmax),
    aten._softmax.default: (_always, _softmax),
    aten.log_softmax.int: (_always, _log_softmax),
    aten._log_softmax.default: (_always, _log_softmax),
    aten.__and__.Tensor: (_on_flags, _as_logical(torch.logical_and)),
    aten.bitwise_and.Tensor: (_on_flags, _as_logical(torch.logical_and)),
    aten.__or__.Tensor: (_on_flags, _as_logical(torch.logical_or)),
    aten.bitwise_or.Tensor: (_on_flags, _as_logical(torch.logical_or)),
    aten.constant_pad_nd.default: (_always, _crop_then_pad),
    aten.linear.default: (_vector_weight, _linear_one_row),
}


# ops whose decomposition only approximates them (polynomials: erf, acos, asin) are
# ``op_traits.APPROXIMATED``: the first ``decompose`` of the default pipeline leaves them for
# ``finalize_pipeline``'s, so fusion families see the exact op first (a hand-written exact GELU
# ``0.5 * x * (1 + erf(x / sqrt 2))`` can still fuse into one GELU, by a user's family too,
# before ``erf`` becomes EXP and polynomials)


DECOMPOSITIONS = {
    aten.unfold.default: unfold,
    aten.col2im.default: col2im,
    aten.repeat.default: repeat,
    aten.log1p.default: log1p,
    aten.erf.default: erf,
    aten.slice_scatter.default: slice_scatter,
    aten.pad.default: pad,
    aten.index_put.default: index_put,
    aten.acos.default: acos,
    aten.asin.default: asin,
    aten.flip.default: flip,
    aten.linalg_vector_norm.default: vector_norm,
    aten.expm1.default: expm1,
    aten.var_mean.correction: var_mean,
    aten.var.correction: var,
    aten.group_norm.default: group_norm,
    aten.gather.default: gather,
    aten.scatter.src: scatter_src,
    aten.scatter.value: scatter_value,
    aten.full_like.default: _factory(lambda a: a[0]),
    aten.zeros_like.default: _factory(0),
    aten.ones_like.default: _factory(1),
    aten.empty_like.default: _factory(0),
    aten.new_empty.default: _new(0),
    aten.copy.default: copy,
    aten.argmax.default: _arg(torch.max),
    aten.argmin.default: _arg(torch.min),
    aten.min.other: lambda a, b: torch.minimum(a, b),
    # onert 0.1.0 has no REDUCE_MIN (docs/onert-findings.md): the max of the negation, negated (exact)
    aten.amin.default: lambda x, dim=(), keepdim=False: -torch.amax(-x, dim, keepdim),
    aten.max.other: lambda a, b: torch.maximum(a, b),
}

# convolutions and pools: NHWC custom ops between permutes (Circle computes them channels-last)
DECOMPOSITIONS.update(NHWC_DECOMPOSITIONS)
