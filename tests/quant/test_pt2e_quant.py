"""Static quantization through torch.export + torchao PT2E.

A small linear -> residual add -> RMSNorm -> linear model, quantized with
``CircleQuantizer`` and exported for both targets:

- ``onert``: runs in onert and equals the fake-quantized (``convert_pt2e``) torch model
  within 1 quantization step of the output (measured: 0 steps here);
  FULLY_CONNECTED/ADD are uint8, RMS_NORM is a float island DEQUANTIZE -> RMS_NORM -> QUANTIZE.
- ``npu``: one RMS_NORM on uint8 input/gamma/output with no QUANTIZE/DEQUANTIZE next to it;
  checked structurally (the file read back) and numerically against a numpy reference of
  the quantized op computed from the file's own integers and parameters.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.errors import InputError
from pt2e_util import (LinearNormModel, NormOnly, consumers, np_dequantize, np_quantize, ops_named, output_scale,
                       producers, quantize_pt2e, read)


def _calibration(shape, n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module")
def converted():
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    return quantize_pt2e(model, (x,), _calibration(x.shape)), x


def test_onert_target_runs_and_matches_fake_quant(converted):
    c, x = converted
    cm = circle_fx.export(c, (x,), quant_target="onert")
    cf = read(cm)
    hist = dict(cm.op_histogram())
    assert hist["RMS_NORM"] == 1 and hist["FULLY_CONNECTED"] == 2 and hist["ADD"] == 1, hist
    for fc in ops_named(cf, "FULLY_CONNECTED"):
        ins = [cf.tensors[i] for i in fc.inputs[:2]]
        assert [t.type_name for t in ins] == ["UINT8", "UINT8"], ins
        assert cf.tensors[fc.inputs[2]].type_name == "INT32"
        assert all(t.quantization is not None for t in ins)
    (norm,) = ops_named(cf, "RMS_NORM")
    prod = producers(cf)
    assert prod[norm.inputs[0]].name == "DEQUANTIZE"  # the float island
    assert [op.name for op in consumers(cf, norm.outputs[0])] == ["QUANTIZE"]
    assert cf.tensors[cf.inputs[0]].type_name == "FLOAT32" and cf.tensors[cf.outputs[0]].type_name == "FLOAT32"
    (out,) = cm.run(x)
    ref = c(x).detach().numpy()
    steps = np.abs(out - ref).max() / output_scale(cf)
    print(f"onert vs fake-quant torch: {steps:.3f} output steps")
    assert steps <= 1.0 + 1e-3, steps


def test_npu_target_one_quantized_rms_norm(converted):
    c, x = converted
    cm = circle_fx.export(c, (x,), quant_target="npu")
    cf = read(cm)
    (norm,) = ops_named(cf, "RMS_NORM")
    x_t, g_t = (cf.tensors[i] for i in norm.inputs)
    y_t = cf.tensors[norm.outputs[0]]
    assert (x_t.type_name, g_t.type_name, y_t.type_name) == ("UINT8", "UINT8", "UINT8")
    assert x_t.quantization and g_t.quantization and y_t.quantization
    assert cf.tensor_data(norm.inputs[1]) is not None  # quantized gamma is a constant
    prod = producers(cf)
    assert prod[norm.inputs[0]].name == "ADD"  # the uint8 residual add feeds it directly
    assert [op.name for op in consumers(cf, norm.outputs[0])] in (["FULLY_CONNECTED"], ["RESHAPE"])
    circle_fx.verify(cm.to_bytes())


def test_npu_rms_norm_matches_numpy_reference():
    """x -> Q -> RMSNorm -> Q -> out: the file's RMS_NORM, evaluated in numpy from its own
    integers and parameters, reproduces the fake-quantized torch model to within 1 step."""
    torch.manual_seed(0)
    model, x = NormOnly(32), torch.randn(2, 5, 32) * 3
    c = quantize_pt2e(model, (x,), _calibration(x.shape) + [(x,)])
    cm = circle_fx.export(c, (x,), quant_target="npu")
    cf = read(cm)
    assert [op.name for op in cf.operators] == ["QUANTIZE", "RMS_NORM", "DEQUANTIZE"]
    q_op, norm, dq_op = cf.operators
    xq_t = cf.tensors[q_op.outputs[0]]
    g_t, y_t = cf.tensors[norm.inputs[1]], cf.tensors[norm.outputs[0]]
    eps = norm.raw.BuiltinOptions()
    from circle_schema import circle

    opts = circle.RmsNormOptions.RmsNormOptions()
    opts.Init(eps.Bytes, eps.Pos)
    xq = np_quantize(x.numpy(), xq_t.quantization, np.uint8)
    xf = np_dequantize(xq, xq_t.quantization)
    gamma = np_dequantize(cf.tensor_data(norm.inputs[1]), g_t.quantization)
    y = xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + np.float32(opts.Epsilon())) * gamma
    out = np_dequantize(np_quantize(y, y_t.quantization, np.uint8), y_t.quantization)
    ref = c(x).detach().numpy()
    steps = np.abs(out - ref).max() / y_t.quantization.scale[0]
    print(f"npu RMS_NORM numpy reference vs fake-quant torch: {steps:.3f} steps")
    assert steps <= 1.0 + 1e-3, steps


def test_int8_activations_become_uint8_for_onert():
    """A quantizer with int8 activations (as XNNPACK's): onert's QUANTIZE to int8 is wrong,
    so the onert target stores them as uint8 (q + 128, same real values) and still matches."""
    from circle_fx.quant.pt2e import uint8_spec
    from torchao.quantization.pt2e.observer import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    int8 = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                            observer_or_fake_quant_ctr=MinMaxObserver)
    from circle_fx.quant import CircleQuantizer

    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    c = quantize_pt2e(model, (x,), _calibration(x.shape), CircleQuantizer(activation=int8, weight=uint8_spec(),
                                                                        quantize_elementwise=True))
    assert any(n.args[-1] == torch.int8 for n in c.graph.nodes if "quantize_per_tensor" in str(n.target))
    cm = circle_fx.export(c, (x,))
    cf = read(cm)
    assert {t.type_name for t in cf.tensors} >= {"UINT8"} and "INT8" not in {t.type_name for t in cf.tensors}
    (out,) = cm.run(x)
    steps = np.abs(out - c(x).detach().numpy()).max() / output_scale(cf)
    assert steps <= 1.0 + 1e-3, steps


def test_quant_target_errors():
    with pytest.raises(InputError, match="quant_target='tpu'"):
        circle_fx.export(NormOnly(8), (torch.randn(2, 8),), quant_target="tpu")
    with pytest.raises(InputError, match="no quantize/dequantize"):
        circle_fx.export(NormOnly(8), (torch.randn(2, 8),), quant_target="onert")


def test_weight_only_quantize_of_a_statically_quantized_model_is_refused(converted):
    qmodel, x = converted
    with pytest.raises(InputError, match="already statically quantized"):
        circle_fx.export(qmodel, (x,), quantize="int8-weights")


def test_readme_pt2e_snippet_is_executed():
    """The README's PT2E example is a ``python`` block, so ``test_readme_examples_run``
    (tests/passes/test_passes_api.py) executes it as written, asserts included."""
    from readme import python_blocks

    block = next(b for b in python_blocks() if "prepare_pt2e" in b)
    assert "quant_target=\"onert\"" in block and "cm.run(" in block and "assert" in block


@pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")
def test_graph_from_another_quantizer_exports_and_runs():
    """torchao's XNNPACK quantizer (int8 activations, int8 *per-channel* weights, its own
    annotation of the norm's interior muls): no integer FC on onert for that, so the
    linears become float islands (weights dequantized at compile time), int8 activations
    are stored as uint8; runs in onert within 2 output steps of the fake-quant model
    (measured: 0 steps here, 1 step with other calibration data)."""
    xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    quantizer = xnnpack.XNNPACKQuantizer().set_global(xnnpack.get_symmetric_quantization_config(is_per_channel=True))
    c = quantize_pt2e(model, (x,), _calibration(x.shape) + [(x,)], quantizer)
    assert any("dequantize_per_channel" in str(n.target) for n in c.graph.nodes)
    cm = circle_fx.export(c, (x,))
    cf = read(cm)
    assert "INT8" not in {t.type_name for t in cf.tensors}
    for fc in ops_named(cf, "FULLY_CONNECTED"):
        assert cf.tensors[fc.inputs[1]].type_name == "FLOAT32"
    (out,) = cm.run(x)
    steps = np.abs(out - c(x).detach().numpy()).max() / output_scale(cf)
    print(f"XNNPACK-quantized graph, onert vs fake-quant torch: {steps:.3f} output steps")
    assert steps <= 2.0, steps
