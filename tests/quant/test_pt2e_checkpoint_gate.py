"""The PT2E agreement gate (onert file vs its fake-quant reference) on a reduced setting:
SmolLM2-135M cut to its first 2 decoder layers, 64 tokens of the evaluation text, calibration 4 x 64 tokens, ``quant_target="onert"``:
the onert file must agree with the fake-quantized torch model on >= 98 % of top-1 tokens.

- The default ``CircleQuantizer()`` does not (0.844 measured 2026-12-05): onert's uint8
  FULLY_CONNECTED rounds twice where the fake-quant rounds once
  (tests/quant/test_onert_fc_rounding.py), 0.4 % of layer-0 outputs move by one step, later
  quantizations amplify that, and the uint8 logits (step 0.43) tie at the top on 9 % of
  positions. Strict xfail: it fails loudly once the gate is met.
- The route around the kernel: ``per_channel_weights=True``. onert 0.1.0 has no per-channel
  uint8 FULLY_CONNECTED, so every quantized linear is a float island (DEQUANTIZE -> float
  FULLY_CONNECTED with the dequantized per-row weights -> QUANTIZE): the activations are still
  uint8 at every linear's input and output as in the reference, but no integer requantization
  happens, and the file computes what the fake-quant model computes (1.000 measured here).
  Its cost: the weights are stored as float32 (4x), no integer GEMM. On 2 layers this pins that
  no kernel of that file departs from the reference. It does NOT meet the gate on the full model:
  0.805 at 30 layers / 128 tokens (onert's float GEMM differs from torch's in the last bit,
  and 30 layers of uint8 re-quantization amplify that); docs/onert-findings.md and
  benchmarks/README.md (``pt2e_accuracy.py``) have the full-model numbers.
- ``CircleQuantizer(per_channel_weights=True, linear_outputs="float")`` (outputs of the linears
  not re-quantized) measured 1.000 on this cut too (2026-12-05; not a case here, to keep the slow
  suite's budget). On the full model it departs later and slower (0.875 at 30 layers / 128 tokens
  vs 0.805, ``benchmarks/pt2e_localize.py``) and still misses 0.98.
"""
from __future__ import annotations

import pytest
import torch

import checkpoint
import circle_fx
from pt2e_util import ops_named, read

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not checkpoint.available(), reason=checkpoint.SKIP_REASON)]

LAYERS, TOKENS = 2, 64

DEFAULT_FAILS = pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "onert vs fake-quant top-1 0.844 < 0.98 (2 layers, 64 tokens): onert's uint8 FULLY_CONNECTED "
    "double rounding, amplified; docs/onert-findings.md"))


@pytest.mark.parametrize("options", [pytest.param({}, id="default", marks=DEFAULT_FAILS),
                                     pytest.param({"per_channel_weights": True}, id="float-island-linears")])
def test_onert_agrees_with_fake_quant_on_smollm2_cut(options):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from circle_fx.quant import CircleQuantizer

    model = checkpoint.logits_model()
    layers = model.model.model.layers
    try:
        model.model.model.layers = layers[:LAYERS]  # the cached model: restored below
        ev, cal = checkpoint.eval_ids(TOKENS), checkpoint.calibration_ids(TOKENS)
        gm = torch.export.export(model, (ev,), strict=False).module()
    finally:
        model.model.model.layers = layers
    prepared = prepare_pt2e(gm, CircleQuantizer(**options))
    with torch.no_grad():
        for ids in cal:
            prepared(ids)
        converted = convert_pt2e(prepared)
        fake_quant = converted(ev).numpy()
    cm = circle_fx.export(converted, (ev,), quant_target="onert")
    cf = read(cm)
    fcs = ops_named(cf, "FULLY_CONNECTED")
    integer = [fc for fc in fcs if cf.tensors[fc.outputs[0]].quantization is not None]
    if options:  # the route: every FULLY_CONNECTED float, so no integer requantization anywhere
        assert fcs and not integer
    (logits,) = cm.run(ev)
    agreement = checkpoint.top1_agreement(logits, fake_quant)
    print(f"SmolLM2 cut to {LAYERS} layers, {TOKENS} tokens, {options or 'default'}: onert vs fake-quant top-1 "
          f"{agreement:.3f}")
    assert agreement >= 0.98
