"""Does onert 0.1.0 run CONV_2D / DEPTHWISE_CONV_2D with int8 weights correctly, per-channel
and per-tensor scales, with int8 or float32 (hybrid) activations? A probe table (issue 21 item 5:
quantize a CNN's convolutions per channel only where onert computes them right).

Each row is one hand-built one-operator Circle file (3x3 kernel, VALID, stride 1, a 10x10
map; weights with channel magnitudes 0.05 .. 2.0, so per-tensor scales lose the small
channels), run in onert and compared with a numpy reference:

- int8 activations (asymmetric input / output, symmetric int8 weights, int32 bias at
  ``input_scale * weight_scale[c]``): the exact int32 accumulators requantized with
  round-to-nearest; the error is in output steps (onert's fixed-point multiplier may round
  a tie the other way: 1 step).
- float32 activations (hybrid): a float convolution of the float input with the dequantized
  weights; onert's hybrid kernels quantize the input at run time, so the error is that of
  an int8 input.

- uint8 activations (what PT2E's onert target uses: its int8 QUANTIZE is wrong) with uint8
  per-tensor weights, or int8 weights per channel / per tensor: output steps against the
  exact reference.

    python benchmarks/onert_conv_int8.py
"""
import os
import tempfile

import flatbuffers
import numpy as np
from circle_schema.v0_10.circle.Model import ModelT
from circle_schema.v0_10.circle.SubGraph import SubGraphT
from circle_schema.v0_10.circle.Tensor import TensorT
from circle_schema.v0_10.circle.Buffer import BufferT
from circle_schema.v0_10.circle.Operator import OperatorT
from circle_schema.v0_10.circle.OperatorCode import OperatorCodeT
from circle_schema.v0_10.circle.Conv2DOptions import Conv2DOptionsT
from circle_schema.v0_10.circle.DepthwiseConv2DOptions import DepthwiseConv2DOptionsT
from circle_schema.v0_10.circle.QuantizationParameters import QuantizationParametersT
from circle_schema.v0_10.circle.BuiltinOperator import BuiltinOperator as BO
from circle_schema.v0_10.circle.BuiltinOptions import BuiltinOptions as BOpt
from circle_schema.v0_10.circle.TensorType import TensorType as TT
from circle_schema.v0_10.circle.Padding import Padding
from onert import infer

def qp(scale, zp, dim=0):
    q = QuantizationParametersT(); q.scale = list(map(float, np.atleast_1d(scale))); q.zeroPoint = list(map(int, np.atleast_1d(zp))); q.quantizedDimension = dim; return q

def build(path, kind, x_shape, w_q, w_scale, b_q, sx, zx, so, zo, out_shape, hybrid):
    m = ModelT(); m.version = 3
    oc = OperatorCodeT(); code = BO.CONV_2D if kind == "conv" else BO.DEPTHWISE_CONV_2D
    oc.builtinCode = code; oc.deprecatedBuiltinCode = code; oc.version = 1; m.operatorCodes = [oc]
    bufs = [BufferT()]; sg = SubGraphT(); sg.tensors = []; sg.operators = []
    def T(name, shape, tt, data=None, q=None):
        t = TensorT(); t.name = name; t.shape = list(shape); t.type = tt; t.buffer = 0
        if data is not None:
            b = BufferT(); b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8); bufs.append(b); t.buffer = len(bufs) - 1
        t.quantization = q; sg.tensors.append(t); return len(sg.tensors) - 1
    dim = 0 if kind == "conv" else 3
    if hybrid:
        x = T("x", x_shape, TT.FLOAT32); o = T("y", out_shape, TT.FLOAT32)
        b = T("b", [len(w_scale)], TT.FLOAT32, (b_q * sx * w_scale).astype(np.float32))
    else:
        x = T("x", x_shape, TT.INT8, q=qp(sx, zx)); o = T("y", out_shape, TT.INT8, q=qp(so, zo))
        b = T("b", [len(w_scale)], TT.INT32, b_q.astype(np.int32), qp(sx * w_scale, np.zeros(len(w_scale)), 0))
    w = T("w", w_q.shape, TT.INT8, w_q.astype(np.int8), qp(w_scale, np.zeros(len(w_scale)), dim))
    op = OperatorT(); op.opcodeIndex = 0; op.inputs = [x, w, b]; op.outputs = [o]
    if kind == "conv":
        op.builtinOptionsType = BOpt.Conv2DOptions; opt = Conv2DOptionsT()
    else:
        op.builtinOptionsType = BOpt.DepthwiseConv2DOptions; opt = DepthwiseConv2DOptionsT(); opt.depthMultiplier = 1
    opt.padding = Padding.VALID; opt.strideH = opt.strideW = 1; opt.dilationHFactor = opt.dilationWFactor = 1
    op.builtinOptions = opt; sg.operators.append(op)
    sg.inputs = [x]; sg.outputs = [o]; m.subgraphs = [sg]; m.buffers = bufs
    fb = flatbuffers.Builder(0); fb.Finish(m.Pack(fb), file_identifier=b"CIR0"); open(path, "wb").write(fb.Output())

def ref_acc(kind, xq, zx, wq):  # int32 accumulators, NHWC, VALID, stride 1
    n, h, w_, ci = xq.shape
    x = xq.astype(np.int64) - zx
    if kind == "conv":
        co, kh, kw, _ = wq.shape
        out = np.zeros((n, h - kh + 1, w_ - kw + 1, co), np.int64)
        for i in range(kh):
            for j in range(kw):
                out += np.einsum("nhwc,oc->nhwo", x[:, i:i + out.shape[1], j:j + out.shape[2]], wq[:, i, j].astype(np.int64))
    else:
        _, kh, kw, co = wq.shape
        out = np.zeros((n, h - kh + 1, w_ - kw + 1, co), np.int64)
        for i in range(kh):
            for j in range(kw):
                out += x[:, i:i + out.shape[1], j:j + out.shape[2]] * wq[0, i, j].astype(np.int64)
    return out

def build_u8(path, kind, x_shape, w_q, w_scale, w_zp, w_tt, b_q, sx, zx, so, zo, out_shape):
    import flatbuffers
    from circle_schema.v0_10.circle.Model import ModelT
    from circle_schema.v0_10.circle.SubGraph import SubGraphT
    from circle_schema.v0_10.circle.Tensor import TensorT
    from circle_schema.v0_10.circle.Buffer import BufferT
    from circle_schema.v0_10.circle.Operator import OperatorT
    from circle_schema.v0_10.circle.OperatorCode import OperatorCodeT
    from circle_schema.v0_10.circle.Conv2DOptions import Conv2DOptionsT
    from circle_schema.v0_10.circle.DepthwiseConv2DOptions import DepthwiseConv2DOptionsT
    from circle_schema.v0_10.circle.BuiltinOperator import BuiltinOperator as BO
    from circle_schema.v0_10.circle.BuiltinOptions import BuiltinOptions as BOpt
    from circle_schema.v0_10.circle.Padding import Padding
    m = ModelT(); m.version = 3
    m.operatorCodes = []
    for code in (BO.CONV_2D if kind == "conv" else BO.DEPTHWISE_CONV_2D, BO.QUANTIZE, BO.DEQUANTIZE):
        oc = OperatorCodeT(); oc.builtinCode = code; oc.deprecatedBuiltinCode = code; oc.version = 1; m.operatorCodes.append(oc)
    bufs = [BufferT()]; sg = SubGraphT(); sg.tensors = []; sg.operators = []
    def T(name, shape, tt, data=None, q=None):
        t = TensorT(); t.name = name; t.shape = list(shape); t.type = tt; t.buffer = 0
        if data is not None:
            b = BufferT(); b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8); bufs.append(b); t.buffer = len(bufs) - 1
        t.quantization = q; sg.tensors.append(t); return len(sg.tensors) - 1
    dim = 0 if kind == "conv" else 3
    xf_ = T("xf", x_shape, TT.FLOAT32); yf = T("yf", out_shape, TT.FLOAT32)
    x = T("x", x_shape, TT.UINT8, q=qp(sx, zx)); o = T("y", out_shape, TT.UINT8, q=qp(so, zo))
    from circle_schema.v0_10.circle.QuantizeOptions import QuantizeOptionsT
    from circle_schema.v0_10.circle.DequantizeOptions import DequantizeOptionsT
    qop = OperatorT(); qop.opcodeIndex = 1; qop.inputs = [xf_]; qop.outputs = [x]; qop.builtinOptionsType = BOpt.QuantizeOptions; qop.builtinOptions = QuantizeOptionsT()
    sg.operators.append(qop)
    b = T("b", [len(w_scale)], TT.INT32, b_q.astype(np.int32), qp(sx * w_scale, np.zeros(len(w_scale)), 0))
    w = T("w", w_q.shape, w_tt, w_q, qp(w_scale, w_zp, dim))
    op = OperatorT(); op.opcodeIndex = 0; op.inputs = [x, w, b]; op.outputs = [o]
    if kind == "conv":
        op.builtinOptionsType = BOpt.Conv2DOptions; opt = Conv2DOptionsT()
    else:
        op.builtinOptionsType = BOpt.DepthwiseConv2DOptions; opt = DepthwiseConv2DOptionsT(); opt.depthMultiplier = 1
    opt.padding = Padding.VALID; opt.strideH = opt.strideW = 1; opt.dilationHFactor = opt.dilationWFactor = 1
    op.builtinOptions = opt; sg.operators.append(op)
    dop = OperatorT(); dop.opcodeIndex = 2; dop.inputs = [o]; dop.outputs = [yf]; dop.builtinOptionsType = BOpt.DequantizeOptions; dop.builtinOptions = DequantizeOptionsT()
    sg.operators.append(dop)
    sg.inputs = [xf_]; sg.outputs = [yf]; m.subgraphs = [sg]; m.buffers = bufs
    fb = flatbuffers.Builder(0); fb.Finish(m.Pack(fb), file_identifier=b"CIR0"); open(path, "wb").write(fb.Output())


def uint8_rows(rng, tmp):
    """uint8 activations (the onert target's PT2E type: float in, QUANTIZE, the convolution,
    DEQUANTIZE; onert's Python API takes no uint8 model input) with uint8 per-tensor weights
    (asymmetric) or int8 weights: the output steps against the exact reference."""
    for kind in ("conv", "depthwise"):
        ci, co = (16, 24) if kind == "conv" else (24, 24)
        xs = [1, 10, 10, ci]
        shape = (co, 3, 3, ci) if kind == "conv" else (1, 3, 3, co)
        wf = rng.standard_normal(shape).astype(np.float32)
        cshape = (co, 1, 1, 1) if kind == "conv" else (1, 1, 1, co)
        wf *= np.linspace(0.05, 2.0, co).reshape(cshape)
        axis = (1, 2, 3) if kind == "conv" else (0, 1, 2)
        xf = rng.standard_normal(xs).astype(np.float32)
        sx = float((xf.max() - xf.min()) / 255); zx = int(np.round(-xf.min() / sx))
        xq = np.clip(np.round(xf / sx) + zx, 0, 255).astype(np.uint8)
        for mode in ("u8 per-tensor", "i8 per-channel", "i8 per-tensor"):
            if mode == "u8 per-tensor":
                lo, hi = min(wf.min(), 0), max(wf.max(), 0); s = (hi - lo) / 255; zw = int(np.round(-lo / s))
                ws = np.full(co, s, np.float32); wz = np.full(co, zw); wq = np.clip(np.round(wf / s) + zw, 0, 255).astype(np.uint8); tt = TT.UINT8
                wint = wq.astype(np.int64) - zw
            else:
                amax = np.abs(wf).max(axis=axis) if "channel" in mode else np.full(co, np.abs(wf).max())
                ws = (amax / 127).astype(np.float32); wz = np.zeros(co, int)
                wq = np.clip(np.round(wf / ws.reshape(cshape)), -127, 127).astype(np.int8); tt = TT.INT8; wint = wq.astype(np.int64)
                if "tensor" in mode: ws = ws[:1]; wz = wz[:1]
            bq = rng.integers(-1000, 1000, co)
            acc = ref_acc(kind, xq.astype(np.int64), zx, wint) + bq
            real = acc * (sx * (ws if len(ws) > 1 else ws[0]))
            so = float((real.max() - real.min()) / 255); zo = int(np.round(-real.min() / so))
            ref = np.clip(np.round(real / so) + zo, 0, 255)
            path = os.path.join(tmp, f"{kind}{mode.replace(' ', '')}.circle")
            build_u8(path, kind, xs, wq, np.broadcast_to(ws, (co,)).copy() if len(ws)==1 and False else ws, wz, tt, bq, sx, zx, so, zo, list(acc.shape))
            try:
                yf_ = infer.session(path, "cpu").infer([((xq.astype(np.float32) - zx) * np.float32(sx)).astype(np.float32)])[0]
                y = np.round(yf_ / so) + zo
                err = f"{int(np.abs(y.astype(np.int64) - ref).max())} steps (uint8 output)"
            except Exception as e:
                err = "- " + str(e).splitlines()[0][:120]
            print(f"| {'CONV_2D' if kind == 'conv' else 'DEPTHWISE_CONV_2D'} | {mode} | uint8 | {err} | |", flush=True)


def main():
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp()
    print("| op | weight scales | activations | max error vs reference | note |\n|---|---|---|---|---|")
    for kind in ("conv", "depthwise"):
        ci, co = (16, 24) if kind == "conv" else (24, 24)
        xs = [1, 10, 10, ci]
        wf = rng.standard_normal((co, 3, 3, ci) if kind == "conv" else (1, 3, 3, co)).astype(np.float32)
        wf *= np.linspace(0.05, 2.0, co).reshape((co, 1, 1, 1) if kind == "conv" else (1, 1, 1, co))
        axis = (1, 2, 3) if kind == "conv" else (0, 1, 2)
        xf = rng.standard_normal(xs).astype(np.float32)
        sx, zx = float((xf.max() - xf.min()) / 255), 0
        zx = int(np.round(-128 - xf.min() / sx))
        xq = np.clip(np.round(xf / sx) + zx, -128, 127).astype(np.int8)
        for per_channel in (True, False):
            amax = np.abs(wf).max(axis=axis) if per_channel else np.full(co, np.abs(wf).max())
            ws = (amax / 127).astype(np.float32)
            wq = np.clip(np.round(wf / ws.reshape((co, 1, 1, 1) if kind == "conv" else (1, 1, 1, co))), -127, 127).astype(np.int8)
            bq = rng.integers(-1000, 1000, co)
            acc = ref_acc(kind, xq, zx, wq) + bq
            real = acc * (sx * ws)
            so = float((real.max() - real.min()) / 255); zo = int(np.round(-128 - real.min() / so))
            ref = np.clip(np.round(real / so) + zo, -128, 127)
            out_shape = list(acc.shape)
            for hybrid in (False, True):
                path = os.path.join(tmp, f"{kind}_{per_channel}_{hybrid}.circle")
                build(path, kind, xs, wq, ws, bq, sx, zx, so, zo, out_shape, hybrid)
                try:
                    s = infer.session(path, "cpu")
                    if hybrid:  # any float input (not on a grid) against a float conv with the dequantized weights
                        y = s.infer([xf])[0]
                        xd = xf.astype(np.float64)
                        wd = wq.astype(np.float64) * ws.reshape((co, 1, 1, 1) if kind == "conv" else (1, 1, 1, co))
                        fr = np.zeros(out_shape)
                        for i in range(3):
                            for j in range(3):
                                win = xd[:, i:i + out_shape[1], j:j + out_shape[2]]
                                fr += np.einsum("nhwc,oc->nhwo", win, wd[:, i, j]) if kind == "conv" else win * wd[0, i, j]
                        fr += bq * sx * ws
                        err = f"{np.abs(y - fr).max():.3g} (float; outputs up to {np.abs(fr).max():.3g})"
                    else:
                        y = s.infer([xq])[0]
                        err = f"{int(np.abs(y.astype(np.int64) - ref).max())} steps (int8 output)"
                    note = ""
                except Exception as e:
                    err, note = "-", str(e).splitlines()[0][:120]
                print(f"| {'CONV_2D' if kind == 'conv' else 'DEPTHWISE_CONV_2D'} | {'per-channel' if per_channel else 'per-tensor'} | "
                      f"{'float32 (hybrid)' if hybrid else 'int8'} | {err} | {note} |", flush=True)
    uint8_rows(rng, tmp)


if __name__ == "__main__":
    main()
