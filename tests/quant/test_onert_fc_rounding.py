"""onert 0.1.0's uint8 FULLY_CONNECTED requantizes like TFLite: ``acc * M`` with the
multiplier ``M = s_x * s_w / s_out`` split into a 31-bit mantissa and a power of two, the
accumulator times the mantissa rounded to an integer first, then a rounding right shift
(two roundings). torchao's fake-quant computes ``round(y / s_out)`` once (half to even).
Results within ``0.5 * 2**-shift`` steps of a half-way point therefore come out one step
apart (0.4-0.6 % of the outputs of SmolLM2's q/k/v projections; docs/onert-findings.md,
"FULLY_CONNECTED requantization"). This pins both halves: onert equals the double-rounding
model bit for bit, and differs from the fake-quant reference.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import circle_fx
from pt2e_util import ops_named, quantize_pt2e, read


def _double_rounding(acc: np.ndarray, multiplier: float) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier (the non-single-rounding build), for any M."""
    mantissa, exp = math.frexp(multiplier)
    q = int(round(mantissa * (1 << 31)))
    if q == 1 << 31:
        q, exp = q // 2, exp + 1
    x = acc.astype(np.int64) * (1 << max(exp, 0))
    ab = x * q
    s = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(s >= 0, s // (1 << 31), -((-s) // (1 << 31)))  # C division: toward zero
    shift = max(-exp, 0)
    mask = (1 << shift) - 1
    return (high >> shift) + ((high & mask) > (mask >> 1) + (high < 0))


def test_uint8_fully_connected_rounds_twice():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).eval()
    x = torch.randn(64, 256)
    converted = quantize_pt2e(model, (x,), [(torch.randn(64, 256),) for _ in range(4)])
    cm = circle_fx.export(converted, (x,), quant_target="onert")
    cf = read(cm)
    (fc,) = ops_named(cf, "FULLY_CONNECTED")
    xq_t, w_t, out_t = (cf.tensors[i].quantization for i in (fc.inputs[0], fc.inputs[1], fc.outputs[0]))
    s_x, s_w, s_o = (float(np.float32(t.scale[0])) for t in (xq_t, w_t, out_t))
    z_x, z_w, z_o = (int(t.zero_point[0]) for t in (xq_t, w_t, out_t))
    w = cf.tensor_data(fc.inputs[1]).astype(np.int64).reshape(256, 256)
    xq = np.clip(np.round(x.numpy() * np.float32(1 / s_x)) + z_x, 0, 255).astype(np.int64)
    acc = (xq - z_x) @ (w - z_w).T
    (y,) = cm.run(x)
    onert_q = np.round(y / np.float32(s_o)).astype(np.int64) + z_o  # the DEQUANTIZE undone
    model_q = np.clip(_double_rounding(acc, s_x * s_w / s_o) + z_o, 0, 255)
    once = np.clip(np.round(acc * (s_x * s_w / s_o)) + z_o, 0, 255)  # fake-quant: one rounding
    assert np.array_equal(onert_q, model_q)
    differ = np.mean(onert_q != once)
    print(f"uint8 FC: onert = double rounding exactly; differs from one rounding at {100 * differ:.2f} % "
          f"of outputs (multiplier {s_x * s_w / s_o:.4g})")
    assert 0 < differ < 0.05
    assert np.abs(onert_q - once).max() == 1


def test_quantize_rounds_ties_away_from_zero():
    """onert's float -> uint8 QUANTIZE rounds a value exactly half-way between two steps away
    from zero; torchao's ``quantize_per_tensor`` rounds it to even. Inputs ``(k + 0.5) * s_x``
    through a linear with identity weights (per-row weights: a float-island FC, so the input
    QUANTIZE is the only rounding that can differ): the file and the fake-quant model differ
    at exactly the k where the two rules disagree."""
    from circle_fx.quant import CircleQuantizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(4))
    calibration = torch.linspace(-2, 2, 64).reshape(16, 4)
    converted = quantize_pt2e(model, (calibration,), [(calibration,)], CircleQuantizer(per_channel_weights=True))
    q = next(n for n in converted.graph.nodes if "quantize_per_tensor" in str(n.target))
    s_x, z_x = float(q.args[1]), int(q.args[2])
    k = np.arange(-32, 32)
    x = torch.from_numpy(((k + 0.5) * np.float32(s_x)).astype(np.float32).reshape(16, 4))
    (y,) = circle_fx.export(converted, (x,), quant_target="onert").run(x)
    differ = np.abs(y - converted(x).detach().numpy()).reshape(-1) > 1e-6
    away_vs_even = ((k < 0) & (k % 2 == 1)) | ((k >= 0) & (k % 2 == 0))  # where round-half-away != half-even
    assert z_x == 127
    assert np.array_equal(differ, away_vs_even)
