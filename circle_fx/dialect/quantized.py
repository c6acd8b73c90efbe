"""Quantized Circle ops as torch custom ops (``torch.ops.circle.q_*``).

The Q/DQ pass (:mod:`circle_fx.quant.qdq`) replaces a ``dequantize -> op -> quantize``
chain by one of these. Their operands and results are the *integer* tensors (uint8 or
int8) the Circle file holds, and their arguments carry every scale and zero point, so a
rewritten graph still runs in eager PyTorch: each eager kernel dequantizes, computes in
float32 and quantizes again, exactly as the fake-quantized (PT2E ``convert_pt2e``) graph
does. That is also the numpy-free reference the tests compare a Circle file against.

No torchao import here: these ops do not depend on how the graph was quantized.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import define
from .nhwc import ACTIVATIONS, conv2d_nhwc

def dequantize(q: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """``(q - zp) * scale`` in float32, as ``quantized_decomposed.dequantize_per_tensor``."""
    return (q.to(torch.float32) - zp) * scale


def quantize(y: torch.Tensor, scale: float, zp: int, dtype: torch.dtype) -> torch.Tensor:
    """``clamp(round(y / scale) + zp)`` to ``dtype``'s range, as ``quantize_per_tensor``
    (which multiplies by ``1 / scale``; round half to even)."""
    info = torch.iinfo(dtype)
    return torch.clamp(torch.round(y * (1.0 / scale)) + zp, info.min, info.max).to(dtype)


def _q_linear(x, x_scale, x_zp, w, w_scale, w_zp, bias, out_scale, out_zp, activation: str = "none"):
    """``activation`` (none, relu, relu6): a ``circle.linear_act`` whose output PT2E quantized
    after the ReLU (FULLY_CONNECTED's fused activation, a clamp of the uint8 result)."""
    y = F.linear(dequantize(x, x_scale, x_zp), dequantize(w, w_scale, w_zp), bias)
    return quantize(ACTIVATIONS[activation](y), out_scale, out_zp, x.dtype)


def _q_linear_pc(x, x_scale, x_zp, w, w_scales, w_zps, bias, out_scale, out_zp):
    """Per-channel weights (one scale and zero point per output row, ``npu`` target)."""
    wf = (w.to(torch.float32) - w_zps.to(torch.float32)[:, None]) * w_scales.to(torch.float32)[:, None]
    y = F.linear(dequantize(x, x_scale, x_zp), wf, bias)
    return quantize(y, out_scale, out_zp, x.dtype)


def _linear_pc_fake(x, x_scale, x_zp, w, w_scales, w_zps, bias: Optional[torch.Tensor], out_scale, out_zp):
    return x.new_empty([*x.shape[:-1], w.shape[0]])


def _q_conv2d(x, x_scale, x_zp, w, w_scale, w_zp, bias, stride, padding, dilation, groups: int, activation: str,
              out_scale, out_zp):
    """``circle.conv2d_nhwc`` (NHWC, explicit pads, fused activation) on dequantized operands."""
    y = conv2d_nhwc(dequantize(x, x_scale, x_zp), dequantize(w, w_scale, w_zp), bias,
                    stride, padding, dilation, groups, activation)
    return quantize(y, out_scale, out_zp, x.dtype)


def _conv2d_fake(x, x_scale, x_zp, w, w_scale, w_zp, bias, stride, padding, dilation, groups, activation,
                 out_scale, out_zp):
    y = conv2d_nhwc(torch.empty_like(x, dtype=torch.float32), torch.empty_like(w, dtype=torch.float32),
                    None, stride, padding, dilation, groups, activation)
    return torch.empty_like(y, dtype=x.dtype)


def _q_binary(fn):
    def kernel(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp):
        return quantize(fn(dequantize(a, a_scale, a_zp), dequantize(b, b_scale, b_zp)), out_scale, out_zp, a.dtype)
    return kernel


def _q_rms_norm(x, x_scale, x_zp, w, w_scale, w_zp, eps, out_scale, out_zp):
    # circle.rms_norm (the RMSNorm family's op, defined by the time a graph runs: circle_fx imports the families)
    y = torch.ops.circle.rms_norm.default(dequantize(x, x_scale, x_zp), dequantize(w, w_scale, w_zp), eps)
    return quantize(y, out_scale, out_zp, x.dtype)


def _q_embedding(w, w_scale, w_zp, ids, out_scale, out_zp):
    return quantize(dequantize(w, w_scale, w_zp)[ids], out_scale, out_zp, w.dtype)


def _embedding_fake(w, w_scale, w_zp, ids, out_scale, out_zp):
    return w.new_empty([*ids.shape, w.shape[1]])


def _linear_fake(x, x_scale, x_zp, w, w_scale, w_zp, bias: Optional[torch.Tensor], out_scale, out_zp,
                 activation="none"):
    return x.new_empty([*x.shape[:-1], w.shape[0]])


def _binary_fake(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp):
    return a.new_empty(torch.broadcast_shapes(a.shape, b.shape))


def _rms_fake(x, x_scale, x_zp, w, w_scale, w_zp, eps, out_scale, out_zp):
    return torch.empty_like(x)


#: the schema of each op, then ``define`` with its eager and fake kernels; no traits: each one
#: reads scales and zero points a pass must keep with its operands
_SCHEMA = {
    "q_linear": "q_linear(Tensor x, float x_scale, int x_zp, Tensor w, float w_scale, int w_zp, Tensor? bias, "
                "float out_scale, int out_zp, str activation=\"none\") -> Tensor",
    "q_linear_pc": "q_linear_pc(Tensor x, float x_scale, int x_zp, Tensor w, Tensor w_scales, Tensor w_zps, "
                   "Tensor? bias, float out_scale, int out_zp) -> Tensor",
    "q_add": "q_add(Tensor a, float a_scale, int a_zp, Tensor b, float b_scale, int b_zp, "
             "float out_scale, int out_zp) -> Tensor",
    "q_mul": "q_mul(Tensor a, float a_scale, int a_zp, Tensor b, float b_scale, int b_zp, "
             "float out_scale, int out_zp) -> Tensor",
    "q_embedding": "q_embedding(Tensor w, float w_scale, int w_zp, Tensor ids, float out_scale, int out_zp) -> Tensor",
    "q_rms_norm": "q_rms_norm(Tensor x, float x_scale, int x_zp, Tensor w, float w_scale, int w_zp, float eps, "
                  "float out_scale, int out_zp) -> Tensor",
    "q_conv2d": "q_conv2d(Tensor x, float x_scale, int x_zp, Tensor w, float w_scale, int w_zp, Tensor? bias, "
                "int[] stride, int[] padding, int[] dilation, int groups, str activation, "
                "float out_scale, int out_zp) -> Tensor",
}
q_linear = define(_SCHEMA["q_linear"], _q_linear, _linear_fake)
q_linear_pc = define(_SCHEMA["q_linear_pc"], _q_linear_pc, _linear_pc_fake)
q_add = define(_SCHEMA["q_add"], _q_binary(torch.add), _binary_fake)
q_mul = define(_SCHEMA["q_mul"], _q_binary(torch.mul), _binary_fake)
q_rms_norm = define(_SCHEMA["q_rms_norm"], _q_rms_norm, _rms_fake)
q_embedding = define(_SCHEMA["q_embedding"], _q_embedding, _embedding_fake)
q_conv2d = define(_SCHEMA["q_conv2d"], _q_conv2d, _conv2d_fake)
