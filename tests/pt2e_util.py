"""Shared helpers for the PT2E (static quantization) tests: quantize a module with
circle_fx's quantizer through torchao, and look at a Circle file's quantized tensors."""
from __future__ import annotations

import numpy as np
import torch

torchao_pt2e = __import__("pytest").importorskip("torchao.quantization.pt2e.quantize_pt2e")

from circle_fx.circle.reader import read_circle  # noqa: E402
from circle_fx.quant import CircleQuantizer  # noqa: E402


def quantize_pt2e(model, example, calibration, quantizer=None):
    """``torch.export`` -> ``prepare_pt2e`` -> run ``calibration`` -> ``convert_pt2e``.

    Default quantizer: the all-integer scheme (``quantize_elementwise=True``: add, mul and
    RMSNorm units too; ``skip=()``: every linear), which the structural tests check op by op;
    LLM accuracy uses the default ``CircleQuantizer()`` (benchmarks/pt2e_accuracy.py)."""
    gm = torch.export.export(model.eval(), example).module()
    prepared = torchao_pt2e.prepare_pt2e(gm, quantizer or CircleQuantizer(quantize_elementwise=True, skip=()))
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    return torchao_pt2e.convert_pt2e(prepared)


def ops_named(cf, name):
    return [op for op in cf.operators if op.name == name]


def producers(cf) -> dict:
    """tensor index -> the operator writing it."""
    return {o: op for op in cf.operators for o in op.outputs}


def consumers(cf, tensor: int) -> list:
    return [op for op in cf.operators if tensor in op.inputs]


def output_scale(cf) -> float:
    """Scale of the quantized tensor the (float) graph output is dequantized from."""
    prod = producers(cf)
    op = prod[cf.outputs[0]]
    while op.name != "DEQUANTIZE":
        op = prod[op.inputs[0]]
    return cf.tensors[op.inputs[0]].quantization.scale[0]


def read(cm):
    return read_circle(cm.to_bytes())


def np_quantize(x, qp, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(x.astype(np.float32) * np.float32(1.0 / qp.scale[0])) + qp.zero_point[0],
                   info.min, info.max).astype(dtype)


def np_dequantize(q, qp):
    return (q.astype(np.float32) - qp.zero_point[0]) * np.float32(qp.scale[0])



class LinearNormModel(torch.nn.Module):
    """linear -> residual add -> Llama-style RMSNorm -> linear."""

    def __init__(self, d=16, out=8):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.w = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.fc2 = torch.nn.Linear(d, out)

    def forward(self, x):
        y = self.fc(x) + x
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.fc2(self.w * y)


class NormOnly(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        return self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
