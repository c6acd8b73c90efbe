"""torch's NCHW convolutions and pools -> ``permute -> circle.*_nhwc -> permute``.

Circle computes convolutions and pools channels-last (:mod:`circle_fx.dialect.nhwc`). Each op
here becomes its NHWC custom op between a permute to NHWC and one back; alone that costs two
TRANSPOSEs per op, but the layout pass (:mod:`circle_fx.layout.propagate`) moves the permutes
through the elementwise ops between convolutions, and ``fold_views`` cancels the pairs that
meet, so a CNN keeps one TRANSPOSE at its input and one at its output.

1-D convolutions (``[B, C, L]``) run as 2-D ones over ``[B, 1, L, C]``: Circle has no
CONV_1D. ``padding="same"`` and ``ceil_mode`` become explicit (possibly asymmetric) padding;
the lowering picks Circle's SAME padding when it is the same thing, else a PAD in front.
Transposed 2-D convolutions are convolutions too (onert 0.1.0 has no TRANSPOSE_CONV kernel:
"KernelGenerator: NYI"): zeros inserted between the input's rows and columns (a reshape and
a PAD, in NHWC), then a stride-1 convolution with the flipped kernel; 1-D ones (a vocoder's
upsampling) are 2-D ones over a unit height. A dilated max pool (MAX_POOL_2D has no dilation)
is the maximum of its ``kh * kw`` strided slices of the ``-inf``-padded input. A 3-D convolution
is a sum of 2-D ones over its time taps (:func:`_conv3d`). Forms Circle cannot run (3-D pools,
transposed 3-D convolutions) return ``NotImplemented`` and stay unsupported with the op's name.
"""
from __future__ import annotations

import torch

from ..dialect.nhwc import avg_pool2d_nhwc, conv2d_nhwc, max_pool2d_nhwc

aten = torch.ops.aten

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _pair(v, n=2) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _same_pads(kernel, dilation) -> list[int]:
    """torch's ``padding="same"`` (stride 1): total ``d*(k-1)``, the odd one at the end."""
    pads = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return pads


def _conv_nd(x, weight, bias, stride, padding, dilation, groups):
    """``conv1d`` / ``conv2d`` (int or ``"same"``/``"valid"`` padding) via ``circle.conv2d_nhwc``."""
    spatial = x.dim() - 2
    if spatial not in (1, 2) or (x.dim() != weight.dim()):
        return NotImplemented
    if spatial == 1:  # a 2-D conv with a 1-row kernel over [B, 1, L, C]
        weight = weight.unsqueeze(2)
        stride, dilation = [1] + _pair(stride, 1), [1] + _pair(dilation, 1)
        padding = padding if isinstance(padding, str) else [0] + _pair(padding, 1)
    stride, dilation = _pair(stride), _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0, 0, 0, 0]
        elif padding == "same" and stride == [1, 1]:
            pads = _same_pads(weight.shape[2:], dilation)
        else:
            return NotImplemented
    else:
        p = _pair(padding)
        pads = [p[0], p[0], p[1], p[1]]
    if spatial == 1:
        # permute first, then unsqueeze: between two 1-D convs the permutes meet and cancel
        y = conv2d_nhwc(x.permute(0, 2, 1).unsqueeze(1), weight, bias, stride, pads, dilation, groups)
        return y.squeeze(1).permute(0, 2, 1)
    return conv2d_nhwc(x.permute(TO_NHWC), weight, bias, stride, pads, dilation, groups).permute(TO_NCHW)


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if x.dim() == 5:
        return _conv3d(x, weight, bias, stride, padding, dilation, groups)
    return _conv_nd(x, weight, bias, stride, padding, dilation, groups)


def _conv3d(x, weight, bias, stride, padding, dilation, groups):
    """``conv3d`` (a video or VLM patch embedding: Qwen-VL's temporal patches) as 2-D
    convolutions: output frame ``f`` is the sum over the kernel's time taps ``t`` of the 2-D
    convolution of input frame ``f * stride + t * dilation - padding`` with that tap's kernel
    (a frame in the time padding adds zeros: it is skipped), plus the bias once. Exact up to the
    order of the sum. ``T_out * kt`` convolutions: fine for the few frames such models see."""
    if weight.dim() != 5 or isinstance(padding, str) and padding != "valid":
        return NotImplemented
    padding = [0, 0, 0] if isinstance(padding, str) else _pair(padding, 3)
    stride, dilation = _pair(stride, 3), _pair(dilation, 3)
    frames, kt = x.shape[2], weight.shape[2]
    out = (frames + 2 * padding[0] - dilation[0] * (kt - 1) - 1) // stride[0] + 1
    ys = []
    for f in range(out):
        acc = None
        for t in range(kt):
            src = f * stride[0] + t * dilation[0] - padding[0]
            if 0 <= src < frames:
                y = _conv_nd(x[:, :, src], weight[:, :, t], None, stride[1:], padding[1:], dilation[1:], groups)
                acc = y if acc is None else acc + y
        if acc is None:  # every tap in the padding: zeros (as a convolution of zeros, for the shape)
            acc = _conv_nd(x[:, :, 0] * 0, weight[:, :, 0], None, stride[1:], padding[1:], dilation[1:], groups)
        ys.append(acc if bias is None else acc + bias.reshape(1, -1, 1, 1))
    return torch.stack(ys, 2)


def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """``conv_transpose2d`` as the convolution it is the adjoint of: ``stride - 1`` zeros
    between input rows/columns, ``dilation * (k - 1) - padding`` rows of zero padding in front
    (``+ output_padding`` behind), a stride-1 convolution with the kernel flipped and its
    in/out channels swapped per group. Exact: the same products, summed in another order.
    1-D (``[B, C, L]``): the 2-D form over ``[B, 1, L, C]``, entered like :func:`_conv_nd`'s
    1-D convolutions so the permutes between them cancel."""
    if x.dim() == 3 and weight.dim() == 3:
        y = _conv_transpose_nhwc(x.permute(0, 2, 1).unsqueeze(1), weight.unsqueeze(2), bias, [1, _pair(stride, 1)[0]],
                                 [0, _pair(padding, 1)[0]], [0, _pair(output_padding, 1)[0]], groups,
                                 [1, _pair(dilation, 1)[0]])
        return y.squeeze(1).permute(0, 2, 1)
    if x.dim() != 4 or weight.dim() != 4:
        return NotImplemented
    return _conv_transpose_nhwc(x.permute(TO_NHWC), weight, bias, _pair(stride), _pair(padding), _pair(output_padding),
                                groups, _pair(dilation)).permute(TO_NCHW)


def _conv_transpose_nhwc(y, weight, bias, stride, padding, output_padding, groups, dilation):
    """:func:`conv_transpose` on an NHWC input, giving NHWC."""
    c_in, c_out_g, kh, kw = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_g, kh, kw).transpose(1, 2)
    w = w.reshape(groups * c_out_g, c_in // groups, kh, kw).flip(2, 3)
    n, h, wd, c = y.shape
    # zeros after every row, then every column, each a 3-D PAD (onert: "Padding for rank > 4 NYI")
    if stride[0] > 1:  # [N*H, 1, W*C] -> [N*H, sH, W*C]
        y = torch.nn.functional.pad(y.reshape(n * h, 1, wd * c), [0, 0, 0, stride[0] - 1])
        h *= stride[0]
        y = y.reshape(n, h, wd, c)
    if stride[1] > 1:  # [N*H*W, 1, C] -> [N*H*W, sW, C]
        y = torch.nn.functional.pad(y.reshape(n * h * wd, 1, c), [0, 0, 0, stride[1] - 1])
        y = y.reshape(n, h, wd * stride[1], c)
    pads = []
    for i in range(2):
        k = dilation[i] * ((kh, kw)[i] - 1)
        before = k - padding[i]
        after = k - padding[i] + output_padding[i] - (stride[i] - 1)  # the trailing zeros are already there
        if before < 0:
            y = y.narrow(1 + i, -before, y.shape[1 + i] + before)
            before = 0
        if after < 0:
            y = y.narrow(1 + i, 0, y.shape[1 + i] + after)
            after = 0
        pads += [before, after]
    return conv2d_nhwc(y, w, bias, [1, 1], pads, dilation, groups)


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return conv_transpose(x, weight, bias, stride, padding, output_padding, groups, dilation)
    return conv(x, weight, bias, stride, padding, dilation, groups)


def _pool_out(size, k, s, p, ceil_mode) -> int:
    """torch's pooled length (a ``ceil_mode`` window must start inside the input or left padding)."""
    out = (size + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _ceil_extra(size, k, s, p, out) -> int:
    """Rows past torch's padding that a ``ceil_mode`` window reads (0 without ceil_mode)."""
    return max((out - 1) * s + k - (size + 2 * p), 0)


def _clipped(k, size, p) -> list[int]:
    """A window longer than the padded input (``ceil_mode`` allows it: EfficientNet pools its
    2 x 2 map with ``AvgPool2d(hidden_dim=2560, ceil_mode=True)``) yields one output that reads
    the whole padded axis, with torch's divisor counting only that: the same window clipped to
    ``size + 2 * padding``. Unclipped, the ceil-mode padding grew the map to 2560 x 2560 x 2560
    (a 64 GB PAD: onert segfaulted)."""
    return [min(k[i], size[i] + 2 * p[i]) for i in range(2)]


def max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if x.dim() != 4:
        return NotImplemented
    k = _pair(kernel_size)
    return _max_pool_nhwc(x.permute(TO_NHWC), k, _pair(stride) if stride else k, _pair(padding), _pair(dilation),
                          ceil_mode).permute(TO_NCHW)


def max_pool1d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """``[N, C, L]`` (or ``[C, L]``) pooled as ``[N, 1, L, C]`` (entered like a 1-D convolution)."""
    if x.dim() not in (2, 3):
        return NotImplemented
    k = _pair(kernel_size, 1)[0]
    y = x if x.dim() == 3 else x.unsqueeze(0)
    y = _max_pool_nhwc(y.permute(0, 2, 1).unsqueeze(1), [1, k], [1, _pair(stride, 1)[0] if stride else k],
                       [0, _pair(padding, 1)[0]], [1, _pair(dilation, 1)[0]], ceil_mode).squeeze(1).permute(0, 2, 1)
    return y if x.dim() == 3 else y.squeeze(0)


def _max_pool_nhwc(y, k, s, p, d, ceil_mode):
    """A max pool of NHWC ``y``: MAX_POOL_2D, or for a dilated window the maximum over its
    ``k[0] * k[1]`` taps, each a strided slice of the input padded with ``-inf`` (torch's padding
    for a max pool, plus what a ``ceil_mode`` window reads past it; MAX_POOL_2D has no
    dilation). Exact: a maximum of the same values."""
    size = [y.shape[1], y.shape[2]]
    if d == [1, 1]:
        k = _clipped(k, size, p)
        pads = []
        for i in range(2):
            pads += [p[i], p[i] + _ceil_extra(size[i], k[i], s[i], p[i], _pool_out(size[i], k[i], s[i], p[i], ceil_mode))]
        return max_pool2d_nhwc(y, k, s, pads)
    span = [d[i] * (k[i] - 1) + 1 for i in range(2)]
    out = [_pool_out(size[i], span[i], s[i], p[i], ceil_mode) for i in range(2)]
    after = [max((out[i] - 1) * s[i] + span[i] - size[i] - p[i], 0) for i in range(2)]
    y = torch.nn.functional.pad(y, [0, 0, p[1], after[1], p[0], after[0]], value=float("-inf"))
    best = None
    for i in range(k[0]):
        for j in range(k[1]):
            tap = y[:, i * d[0]: i * d[0] + (out[0] - 1) * s[0] + 1: s[0], j * d[1]: j * d[1] + (out[1] - 1) * s[1] + 1: s[1]]
            best = tap if best is None else torch.maximum(best, tap)
    return best


def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if x.dim() != 4:
        return NotImplemented
    k = _pair(kernel_size)
    s = _pair(stride) if stride else k
    p = _pair(padding)
    k = _clipped(k, x.shape[2:], p)
    return avg_pool2d_nhwc(x.permute(TO_NHWC), k, s, [p[0], p[0], p[1], p[1]], ceil_mode, count_include_pad,
                           divisor_override).permute(TO_NCHW)


def _bins(n: int, out: int) -> list[tuple[int, int]]:
    """torch's adaptive-pool bins along one axis: ``[floor(i*n/out), ceil((i+1)*n/out))``."""
    return [(i * n // out, -(-(i + 1) * n // out)) for i in range(out)]


def _uniform(bins) -> tuple[int, int] | None:
    """(kernel, stride) when every bin has one size and they start at a fixed step (an
    average pool then computes them: 7 -> 3 bins is kernel 3, stride 2), else None."""
    sizes = {e - s for s, e in bins}
    steps = {b[0] - a[0] for a, b in zip(bins, bins[1:])}
    if len(sizes) != 1 or len(steps) > 1 or steps == {0}:  # {0}: one input cell copied to every bin
        return None
    k = sizes.pop()
    return k, (steps.pop() if steps else k)


def adaptive_avg_pool2d(x, output_size):
    """Each output cell is the mean of its bin (:func:`_bins`). Bins of one size at a fixed
    step along both axes (every dividing size, and many others) are one average pool with
    that kernel and stride; otherwise the axes are pooled one after the other (the mean of
    a rectangle is the mean of its rows' means), an axis with uneven bins as one MEAN per
    bin over its slice, concatenated (UperNet's 1, 2, 3, 6 pyramid on a 16 x 16 map)."""
    if x.dim() != 4:
        return NotImplemented
    size = [x.shape[2 + i] if o is None else o for i, o in enumerate(_pair(output_size))]
    bins = [_bins(n, o) for n, o in zip(x.shape[2:], size)]
    forms = [_uniform(b) for b in bins]
    if all(forms):
        return avg_pool2d(x, [f[0] for f in forms], [f[1] for f in forms])
    y = x.permute(TO_NHWC)
    for axis in range(2):
        if forms[axis] is not None:
            k, s = [1, 1], [1, 1]
            k[axis], s[axis] = forms[axis]
            if k != [1, 1] or s != [1, 1]:
                y = avg_pool2d_nhwc(y, k, s, [0, 0, 0, 0], False, True, None)
        else:
            y = torch.cat([y.narrow(1 + axis, a, b - a).mean(1 + axis, keepdim=True) for a, b in bins[axis]],
                          1 + axis)
    return y.permute(TO_NCHW)


def adaptive_max_pool2d(x, output_size):
    """(values, indices): each output cell's maximum over its bin (:func:`_bins`) and where it
    is, as torch gives it: the flat ``h * W + w`` of the first maximum in the input plane.
    Values: one max pool when the bins are uniform (:func:`_uniform`), else one maximum per
    bin. Indices: per bin, the ARG_MAX of its flattened window, turned into the plane's
    coordinates in float32 (exact below 2**24 positions: onert 0.1.0 has no int64 FLOOR_DIV).
    Unused indices are dead code and removed."""
    if x.dim() != 4:
        return NotImplemented
    h, w = x.shape[2], x.shape[3]
    size = [x.shape[2 + i] if o is None else o for i, o in enumerate(_pair(output_size))]
    if h * w >= 1 << 24:
        return NotImplemented
    bins = [_bins(n, o) for n, o in zip(x.shape[2:], size)]
    forms = [_uniform(b) for b in bins]
    if all(forms):
        values = max_pool2d(x, [f[0] for f in forms], [f[1] for f in forms])
    else:
        values = None
    rows, cells = [], []
    for a, b in bins[0]:
        row_vals, row_idx = [], []
        for c, e in bins[1]:
            window = x[:, :, a:b, c:e].reshape(x.shape[0], x.shape[1], -1)
            if values is None:
                row_vals.append(window.amax(-1, keepdim=True))
            r = window.argmax(-1, keepdim=True).to(torch.float32)
            width = e - c
            i = torch.floor((r + 0.5) / width)  # exact: small integers in float32
            row_idx.append(((i + a) * w + (r - i * width) + c).to(torch.int64))
        rows.append(torch.cat(row_vals, -1) if row_vals else None)
        cells.append(torch.cat(row_idx, -1))
    if values is None:
        values = torch.stack(rows, 2)
    return values, torch.stack(cells, 2)


def adaptive_avg_pool1d(x, output_size):
    """``[N, C, L]`` (or ``[C, L]``) pooled as ``[N, C, 1, L]`` by :func:`adaptive_avg_pool2d`;
    one output (Swin's, FocalNet's, Hiera's pooler) is a MEAN over ``L``."""
    out = _pair(output_size, 1)[0]
    if x.dim() not in (2, 3):
        return NotImplemented
    if out == 1:
        return x.mean(-1, keepdim=True)
    unbatched = x.dim() == 2
    y = adaptive_avg_pool2d((x.unsqueeze(0) if unbatched else x).unsqueeze(-2), [1, out])
    if y is NotImplemented:
        return y
    y = y.squeeze(-2)
    return y.squeeze(0) if unbatched else y


DECOMPOSITIONS = {
    aten.conv1d.default: conv,
    aten.conv2d.default: conv,
    aten.conv1d.padding: conv,
    aten.conv2d.padding: conv,
    aten.conv3d.default: conv,
    aten.conv3d.padding: conv,
    aten.convolution.default: convolution,
    aten.conv_transpose2d.input: conv_transpose,
    aten.conv_transpose1d.default: conv_transpose,
    aten.max_pool2d.default: max_pool2d,
    aten.max_pool1d.default: max_pool1d,
    aten.avg_pool2d.default: avg_pool2d,
    aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.adaptive_avg_pool1d.default: adaptive_avg_pool1d,
    aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
}
