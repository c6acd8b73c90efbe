"""int16 activations for NPUs (``CircleQuantizer(activation_dtype="int16")``, ``quant_target="npu"``).

onert 0.1.0 runs no int16 kernel, so these files are checked against the numpy reference of
the file (:mod:`circle_fx.circle.reference`: every operator from the file's own integers,
parameters and options). The reference itself is checked against onert where onert runs the
file: a float model (equal within 1e-6) and the uint8 ``onert``-target model (within the
steps test_pt2e_llama.py states for onert vs fake-quant).

The int16 file: FULLY_CONNECTED int16 x int8 (per-row scales by default) -> int16 with an
int64 bias, RMS_NORM int16
with an int8 gamma, ADD/MUL int16, every int16 tensor symmetric (zero point 0); verify
accepts it; the reference reproduces the fake-quantized torch model within 1 step of the
output scale (measured: 0 or 1).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle import reference
from circle_fx.errors import InputError
from circle_fx.quant import CircleQuantizer
from pt2e_util import LinearNormModel, ops_named, output_scale, quantize_pt2e, read


def _calibration(shape, n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g) * 2,) for _ in range(n)]


@pytest.fixture(scope="module")
def int16_model():
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16) * 2
    c = quantize_pt2e(model, (x,), _calibration(x.shape) + [(x,)], CircleQuantizer(activation_dtype="int16"))
    return c, x, circle_fx.export(c, (x,), quant_target="npu")


def test_int16_file_structure(int16_model):
    _, _, cm = int16_model
    circle_fx.verify(cm.to_bytes())
    cf = read(cm)
    types = lambda op, idx: [cf.tensors[i].type_name for i in idx]  # noqa: E731
    fcs = ops_named(cf, "FULLY_CONNECTED")
    assert len(fcs) == 2
    for fc in fcs:
        assert types(fc, [*fc.inputs, *fc.outputs]) == ["INT16", "INT8", "INT64", "INT16"]
        w, b = cf.tensors[fc.inputs[1]], cf.tensors[fc.inputs[2]]
        rows = w.shape[0]  # per-row weight scales (the default), and so per-row bias scales
        assert len(w.quantization.scale) == rows and len(b.quantization.scale) == rows
        x_scale = cf.tensors[fc.inputs[0]].quantization.scale[0]
        np.testing.assert_allclose(b.quantization.scale, np.float32(x_scale) * np.float32(w.quantization.scale),
                                   rtol=1e-6)
    (norm,) = ops_named(cf, "RMS_NORM")
    assert types(norm, [*norm.inputs, *norm.outputs]) == ["INT16", "INT8", "INT16"]
    (add,) = ops_named(cf, "ADD")
    assert types(add, [*add.inputs, *add.outputs]) == ["INT16"] * 3
    for t in cf.tensors:
        if t.type_name in ("INT16", "INT8"):
            assert t.quantization is not None and set(t.quantization.zero_point) == {0}, t
    assert not [n for n in cm.report.notes if "npu" in n], cm.report.notes


def test_int16_reference_matches_fake_quant(int16_model):
    c, x, cm = int16_model
    (got,) = reference.run(cm.to_bytes(), [x.numpy()])
    steps = np.abs(got - c(x).detach().numpy()).max() / output_scale(read(cm))
    assert steps <= 1.0 + 1e-3, steps


def test_onert_target_refuses_int16(int16_model):
    c, x, _ = int16_model
    with pytest.raises(InputError, match="int16 activations.*quant_target='npu'"):
        circle_fx.export(c, (x,), quant_target="onert")


def test_activation_dtype_is_checked():
    with pytest.raises(InputError, match="activation_dtype='int8'"):
        CircleQuantizer(activation_dtype="int8")


def test_reference_names_an_operator_it_cannot_evaluate():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    cm = circle_fx.export(model, (torch.randn(2, 4),))
    with pytest.raises(InputError, match="operator 1 GELU has no numpy rule"):
        reference.run(cm.to_bytes(), [np.zeros((2, 4), np.float32)])


# ------------------------------------------------------------- on the tiny Llama (slow)

def _logits(out):
    return (out.logits if hasattr(out, "logits") else out[0]).detach().numpy()


@pytest.mark.slow
def test_tiny_llama_reference_against_onert_and_int16(tiny_llama):
    """The reference equals onert on the float file and the uint8 onert-target file, and the
    int16 npu file's reference equals its fake-quant model (~15 s)."""
    model, (ids,) = tiny_llama
    cm = circle_fx.export(model, (ids,))
    (want,), (got,) = cm.run(ids), reference.run(cm.to_bytes(), [ids.numpy()])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

    g = torch.Generator().manual_seed(1)
    calib = [(torch.randint(0, model.config.vocab_size, ids.shape, generator=g),) for _ in range(4)]
    c = quantize_pt2e(model, (ids,), calib)
    cm = circle_fx.export(c, (ids,), quant_target="onert")
    (want,), (got,) = cm.run(ids), reference.run(cm.to_bytes(), [ids.numpy()])
    scale = output_scale(read(cm))
    assert np.abs(got - want).max() / scale <= 4.0  # onert's float islands (test_pt2e_llama.MAX_STEPS)
    assert np.abs(got - _logits(c(ids))).max() / scale <= 1.0 + 1e-3

    c = quantize_pt2e(model, (ids,), calib, CircleQuantizer(activation_dtype="int16"))
    cm = circle_fx.export(c, (ids,), quant_target="npu")
    cf = read(cm)
    assert {cf.tensors[i].type_name for op in ops_named(cf, "RMS_NORM") for i in op.inputs} == {"INT16", "INT8"}
    (got,) = reference.run(cm.to_bytes(), [ids.numpy()])
    steps = np.abs(got - _logits(c(ids))).max() / output_scale(cf)
    assert steps <= 2.0, steps


def test_reference_conv_2d_matches_onert():
    """CONV_2D (real convolutions, and circle_fx's fast form of a float linear over many rows)."""
    conv = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1)
    x = torch.randn(1, 3, 9, 9)
    cm = circle_fx.export(conv, (x,))
    assert cm.op_histogram()["CONV_2D"] == 1
    (want,), (got,) = cm.run(x), reference.run(cm.to_bytes(), [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_per_channel_weights_keep_a_per_tensor_gamma(dtype):
    """With ``per_channel_weights`` the RMSNorm gamma (1-D) still gets one scale (the
    per-channel observer failed on it in calibration), and the norm stays integer."""
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    q = CircleQuantizer(activation_dtype=dtype, per_channel_weights=True, quantize_elementwise=True)
    c = quantize_pt2e(model, (x,), _calibration(x.shape), q)
    cm = circle_fx.export(c, (x,), quant_target="npu")
    cf = read(cm)
    (norm,) = ops_named(cf, "RMS_NORM")
    gamma = cf.tensors[norm.inputs[1]]
    assert gamma.type_name == ("UINT8" if dtype == "uint8" else "INT8") and len(gamma.quantization.scale) == 1
    # the linears are integer FULLY_CONNECTEDs with per-row weight scales (npu target)
    for fc in ops_named(cf, "FULLY_CONNECTED"):
        w = cf.tensors[fc.inputs[1]]
        assert w.type_name == gamma.type_name and len(w.quantization.scale) == w.shape[0]
    (got,) = reference.run(cm.to_bytes(), [x.numpy()])
    assert np.abs(got - c(x).detach().numpy()).max() / output_scale(cf) <= 1.0 + 1e-3


def test_int16_per_tensor_weights():
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    q = CircleQuantizer(activation_dtype="int16", per_channel_weights=False)
    c = quantize_pt2e(model, (x,), _calibration(x.shape), q)
    cm = circle_fx.export(c, (x,), quant_target="npu")
    cf = read(cm)
    for fc in ops_named(cf, "FULLY_CONNECTED"):
        assert [len(cf.tensors[i].quantization.scale) for i in fc.inputs] == [1, 1, 1]
    (got,) = reference.run(cm.to_bytes(), [x.numpy()])
    assert np.abs(got - c(x).detach().numpy()).max() / output_scale(cf) <= 1.0 + 1e-3


def test_int16_convolutions_stay_float_and_summary_says_so():
    """The int16 scheme annotates convolutions too, but integer convolutions are lowered for
    uint8 x uint8 per tensor only: on the npu target they stay float CONV_2Ds between DEQUANTIZE
    and QUANTIZE, and ``summary()`` names them and why (they used to be left float silently)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 1))  # no ReLU: the
    # reference evaluates no fused activation
    x = torch.randn(1, 3, 8, 8)
    c = quantize_pt2e(model, (x,), _calibration(x.shape), CircleQuantizer(activation_dtype="int16"))
    cm = circle_fx.export(c, (x,), quant_target="npu")
    cf = read(cm)
    convs = ops_named(cf, "CONV_2D")
    assert len(convs) == 2 and all(cf.tensors[op.inputs[1]].type_name == "FLOAT32" for op in convs)
    notes = [n for n in cm.report.notes if "convolution(s) stay float32" in n]
    # one note per reason: the first convolution reads the input's layout permute, the second int16
    assert sum(int(n.split(": ")[1].split()[0]) for n in notes) == 2, notes
    assert all(n.startswith("quant_target='npu'") and "torch.int8 per channel" in n for n in notes), notes
    assert any("its input is torch.int16" in n for n in notes), notes
    assert all(f"note: {n}" in cm.summary() for n in notes)
    (got,) = reference.run(cm.to_bytes(), [x.numpy()])
    assert np.abs(got - c(x).detach().numpy()).max() / output_scale(cf) <= 1.0 + 1e-3
