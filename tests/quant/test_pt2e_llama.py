"""End to end: a tiny random-weight transformers Llama, statically quantized with PT2E
(``CircleQuantizer``, 4 random calibration batches), exported for both targets.

``onert``: runs in onert and matches the converted (fake-quantized) torch model within
``MAX_STEPS`` quantization steps of the logits (measured over 20 random inputs: at most 2
steps; a float-island result next to a rounding boundary (RMS_NORM, softmax, SiLU
computed by onert's kernels vs torch's) rounds the other way and moves an integer by 1,
which later layers carry along),
every RMSNorm is one RMS_NORM, every FULLY_CONNECTED is uint8 x uint8.
``npu``: verifies, every RMS_NORM is uint8 in/gamma/out with no QUANTIZE/DEQUANTIZE next to it
(the token embedding is a uint8 GATHER, so even the first norm reads integers).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from pt2e_util import consumers, ops_named, output_scale, producers, quantize_pt2e, read

#: stated bound: onert vs the fake-quantized torch model, in steps of the logits' scale
MAX_STEPS = 4.0


@pytest.fixture(scope="module")
def quantized_llama(tiny_llama):
    model, (ids,) = tiny_llama
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randint(0, model.config.vocab_size, ids.shape, generator=g),) for _ in range(4)]
    converted = quantize_pt2e(model, (ids,), calib)
    return converted, ids, model.config.num_hidden_layers * 2 + 1


def _logits(out):
    return (out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out).detach()


def test_llama_onert_target(quantized_llama):
    converted, ids, norms = quantized_llama
    cm = circle_fx.export(converted, (ids,), quant_target="onert")
    cf = read(cm)
    assert len(ops_named(cf, "RMS_NORM")) == norms
    fcs = ops_named(cf, "FULLY_CONNECTED")
    assert len(fcs) == 15
    for fc in fcs:
        assert [cf.tensors[i].type_name for i in fc.inputs[:2]] == ["UINT8", "UINT8"]
        assert cf.tensors[fc.outputs[0]].type_name == "UINT8"
    for norm in ops_named(cf, "RMS_NORM"):
        assert producers(cf)[norm.inputs[0]].name == "DEQUANTIZE"
    g = torch.Generator().manual_seed(5)
    for x in [ids] + [torch.randint(0, 128, ids.shape, generator=g) for _ in range(4)]:
        (logits,) = cm.run(x)
        ref = _logits(converted(x)).numpy()
        steps = np.abs(logits - ref).max() / output_scale(cf)
        print(f"tiny Llama, onert vs fake-quant torch: max {steps:.3f} logit steps, "
              f"top-1 agreement {np.mean(logits.argmax(-1) == ref.argmax(-1)):.3f}")
        assert steps <= MAX_STEPS, steps


def test_llama_npu_target(quantized_llama):
    converted, ids, norms = quantized_llama
    cm = circle_fx.export(converted, (ids,), quant_target="npu")
    circle_fx.verify(cm.to_bytes())
    cf = read(cm)
    rms = ops_named(cf, "RMS_NORM")
    assert len(rms) == norms
    prod = producers(cf)
    for norm in rms:
        types = [cf.tensors[i].type_name for i in (*norm.inputs, *norm.outputs)]
        assert types == ["UINT8"] * 3, types
        assert all(cf.tensors[i].quantization is not None for i in (*norm.inputs, *norm.outputs))
        # the first norm reads the uint8 embedding rows (an integer GATHER), the others a
        # uint8 residual ADD; their results go straight into uint8 FULLY_CONNECTEDs
        assert prod[norm.inputs[0]].name in ("ADD", "GATHER"), prod[norm.inputs[0]].name
        assert all(op.name not in ("QUANTIZE", "DEQUANTIZE") for op in consumers(cf, norm.outputs[0]))
    # the embedding is the GATHER from a constant table (others gather run-time values, e.g. repeat_kv)
    (gather,) = [g for g in ops_named(cf, "GATHER") if cf.tensor_data(g.inputs[0]) is not None]
    assert [cf.tensors[i].type_name for i in (gather.inputs[0], gather.outputs[0])] == ["UINT8", "UINT8"]
