"""A numpy reference of a Circle file: every operator evaluated from the file alone.

For files no public runtime runs (the ``npu`` target's integer RMS_NORM, int16 activations:
onert 0.1.0 has no such kernels), this says what the file computes, so it can be checked
against the fake-quantized torch model and scored (perplexity) without a device.

Semantics of a quantized operator, the one the quantized dialect ops state
(``circle_fx.dialect.quantized``): dequantize every quantized input (``(q - zero_point) * scale``,
float32), compute the float op, quantize the result with the output tensor's parameters
(``round(y * (1 / scale)) + zero_point``, half to even, clamped to the integer type). A
plain tensor is used as stored. So QUANTIZE and DEQUANTIZE need no rule of their own, and
an integer FULLY_CONNECTED's int32/int64 bias (scale ``s_x * s_w``) dequantizes like any
operand. Static shapes only; the operators are the ones circle_fx emits for transformer
LLMs (:data:`OPS`); anything else raises naming the operator.

    from circle_fx.circle.reference import run
    (logits,) = run(circle_bytes, [input_ids])
"""
from __future__ import annotations

import numpy as np
from circle_schema import circle

from ..errors import InputError
from .reader import CircleFile, read_circle
from .schema import options_class_name, options_union

__all__ = ["run", "OPS"]

_F = np.float32


def _options(op):
    name = options_class_name(op.builtin_code)
    if name is None:
        return None
    table = op.raw.BuiltinOptions() if options_union(name)[0] == 1 else op.raw.BuiltinOptions2()
    if table is None:
        return None
    obj = getattr(getattr(circle, name), name)()
    obj.Init(table.Bytes, table.Pos)
    return obj


def _no_activation(op, opts):
    act = getattr(opts, "FusedActivationFunction", lambda: 0)() if opts is not None else 0
    if act != 0:
        raise InputError(f"reference: operator {op.index} {op.name} has fused activation {act}, not supported")


def _binary(fn):
    def rule(op, ins, opts, out_shape):
        _no_activation(op, opts)
        return fn(ins[0], ins[1])
    return rule


def _unary(fn):
    return lambda op, ins, opts, out_shape: fn(ins[0])


def _fully_connected(op, ins, opts, out_shape):
    _no_activation(op, opts)
    x, w = ins[0], ins[1]
    y = x.reshape(-1, w.shape[1]) @ w.T
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return y.reshape(out_shape)


def _conv_2d(op, ins, opts, out_shape):
    """NHWC input, OHWI filter, one group: a sum over the kernel taps of strided slices times
    the tap's [O, I] matrix (1x1 convolutions, circle_fx's fast linear form, are one matmul)."""
    _no_activation(op, opts)
    x, w = ins[0], ins[1]
    if w.shape[3] != x.shape[3]:
        raise InputError(f"reference: operator {op.index} CONV_2D with groups (filter {list(w.shape)})")
    sh, sw, dh, dw = opts.StrideH(), opts.StrideW(), opts.DilationHFactor(), opts.DilationWFactor()
    oh, ow = out_shape[1], out_shape[2]
    if opts.Padding() == 0:  # SAME
        ph = max((oh - 1) * sh + (w.shape[1] - 1) * dh + 1 - x.shape[1], 0)
        pw = max((ow - 1) * sw + (w.shape[2] - 1) * dw + 1 - x.shape[2], 0)
        x = np.pad(x, [(0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)])
    y = np.zeros(out_shape, _F)
    for kh in range(w.shape[1]):
        for kw in range(w.shape[2]):
            tap = x[:, kh * dh:kh * dh + (oh - 1) * sh + 1:sh, kw * dw:kw * dw + (ow - 1) * sw + 1:sw, :]
            y += tap @ w[:, kh, kw, :].T
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return y


def _rms_norm(op, ins, opts, out_shape):
    x, gamma = ins[0], ins[1]
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + _F(opts.Epsilon())) * gamma


def _softmax(op, ins, opts, out_shape):
    z = ins[0] * _F(opts.Beta())
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _strided_slice(op, ins, opts, out_shape):
    x, begin, end, strides = ins[0], ins[1], ins[2], ins[3]
    if opts.EllipsisMask() or opts.NewAxisMask():
        raise InputError(f"reference: operator {op.index} STRIDED_SLICE with ellipsis/new-axis masks")
    index = []
    for d in range(len(begin)):
        b = None if opts.BeginMask() >> d & 1 else int(begin[d])
        e = None if opts.EndMask() >> d & 1 else int(end[d])
        if opts.ShrinkAxisMask() >> d & 1:
            index.append(int(begin[d]))
        else:
            index.append(slice(b, e, int(strides[d])))
    return x[tuple(index)]


def _slice(op, ins, opts, out_shape):
    x, begin, size = ins
    return x[tuple(slice(int(b), None if int(n) < 0 else int(b) + int(n)) for b, n in zip(begin, size))]


def _split(op, ins, opts, out_shape):
    return np.split(ins[1], opts.NumSplits(), axis=int(np.asarray(ins[0]).reshape(())))


def _batch_matmul(op, ins, opts, out_shape):
    a, b = ins[0], ins[1]
    if opts.AdjointLhs():
        a = np.swapaxes(a, -1, -2)
    if opts.AdjointRhs():
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def _gather(op, ins, opts, out_shape):
    if opts.BatchDims():
        raise InputError(f"reference: operator {op.index} GATHER with batch_dims")
    return np.take(ins[0], ins[1].astype(np.int64), axis=opts.Axis())


def _mean(op, ins, opts, out_shape):
    return ins[0].mean(axis=tuple(int(a) for a in np.atleast_1d(ins[1])), keepdims=bool(opts.KeepDims()))


def _select(op, ins, opts, out_shape):
    return np.where(ins[0], ins[1], ins[2])


def _logistic(x):
    return _F(1) / (_F(1) + np.exp(-x))


#: operator name -> rule(op, input values, options, output shape) -> real result
OPS = {
    "ADD": _binary(np.add), "SUB": _binary(np.subtract), "MUL": _binary(np.multiply), "DIV": _binary(np.divide),
    "MAXIMUM": _binary(np.maximum), "MINIMUM": _binary(np.minimum), "POW": _binary(np.power),
    "EQUAL": _binary(np.equal), "LESS": _binary(np.less), "GREATER": _binary(np.greater),
    "NEG": _unary(np.negative), "RSQRT": _unary(lambda x: _F(1) / np.sqrt(x)), "SQRT": _unary(np.sqrt),
    "EXP": _unary(np.exp), "TANH": _unary(np.tanh), "LOGISTIC": _unary(_logistic), "ABS": _unary(np.abs),
    "QUANTIZE": _unary(lambda x: x), "DEQUANTIZE": _unary(lambda x: x), "CAST": _unary(lambda x: x),
    "RESHAPE": lambda op, ins, opts, out_shape: ins[0].reshape(out_shape),
    "TRANSPOSE": lambda op, ins, opts, out_shape: np.transpose(ins[0], [int(p) for p in ins[1]]),
    "CONCATENATION": lambda op, ins, opts, out_shape: np.concatenate(ins, axis=opts.Axis()),
    "FULLY_CONNECTED": _fully_connected, "CONV_2D": _conv_2d, "BATCH_MATMUL": _batch_matmul, "RMS_NORM": _rms_norm,
    "SOFTMAX": _softmax, "STRIDED_SLICE": _strided_slice, "SLICE": _slice, "SPLIT": _split, "GATHER": _gather, "MEAN": _mean, "SELECT_V2": _select,
}


#: operators whose other operands are indices, shapes or axes: position(s) of the data
_DATA = {"TRANSPOSE": (0,), "STRIDED_SLICE": (0,), "SLICE": (0,), "GATHER": (0,), "MEAN": (0,), "RESHAPE": (0,),
         "SPLIT": (1,)}


def _real(t, v: np.ndarray) -> np.ndarray:
    qp = t.quantization
    if qp is None:
        return v
    if len(qp.scale) != 1:
        shape = [1] * v.ndim
        shape[qp.axis] = -1
        scale = np.asarray(qp.scale, _F).reshape(shape)
        zp = np.asarray(qp.zero_point, np.int64).reshape(shape)
        return ((v.astype(np.int64) - zp).astype(_F) * scale).astype(_F)
    return (v.astype(np.int64) - qp.zero_point[0]).astype(_F) * _F(qp.scale[0])


def _stored(t, y: np.ndarray) -> np.ndarray:
    dtype = t.dtype
    qp = t.quantization
    if qp is not None:
        info = np.iinfo(dtype)
        q = np.round(y.astype(_F) * _F(1.0 / qp.scale[0])) + qp.zero_point[0]
        return np.clip(q, info.min, info.max).astype(dtype)
    if np.issubdtype(dtype, np.integer) and np.issubdtype(np.asarray(y).dtype, np.floating):
        y = np.trunc(y)  # CAST of a float to an integer type truncates toward zero
    return np.asarray(y).astype(dtype)


def run(src, inputs: list, *, record: dict | None = None) -> list[np.ndarray]:
    """Evaluate the Circle file ``src`` (bytes, path or :class:`CircleFile`) on ``inputs``
    (numpy arrays, in the file's input order); the outputs as stored (float or integer).
    ``record``, if given, receives every tensor's stored value by index."""
    cf = src if isinstance(src, CircleFile) else read_circle(src)
    if len(inputs) != len(cf.inputs):
        raise InputError(f"reference: the file has {len(cf.inputs)} inputs, got {len(inputs)}")
    values: dict[int, np.ndarray] = {}
    for i, x in zip(cf.inputs, inputs):
        values[i] = np.asarray(x).astype(cf.tensors[i].dtype)

    def stored(i):
        if i not in values:
            data = cf.tensor_data(i)
            if data is None:
                raise InputError(f"reference: tensor {i} {cf.tensors[i].name!r} is read before it is written")
            values[i] = data
        return values[i]

    for op in cf.operators:
        rule = OPS.get(op.name)
        if rule is None:
            raise InputError(f"reference: operator {op.index} {op.name} has no numpy rule (known: "
                             f"{', '.join(sorted(OPS))})")
        data = _DATA.get(op.name)  # the other operands are indices, shapes, axes: used as stored
        ins = [None if i < 0 else _real(cf.tensors[i], stored(i)) if data is None or k in data else stored(i)
               for k, i in enumerate(op.inputs)]
        ys = rule(op, ins, _options(op), list(cf.tensors[op.outputs[0]].shape))
        for o, y in zip(op.outputs, ys if isinstance(ys, list) else [ys]):
            out = cf.tensors[o]
            if list(np.shape(y)) != list(out.shape):
                raise InputError(f"reference: operator {op.index} {op.name} computed shape {list(np.shape(y))}, "
                                 f"the file says {list(out.shape)}")
            values[o] = _stored(out, np.asarray(y))
    if record is not None:
        record.update(values)
    return [values[i] for i in cf.outputs]
