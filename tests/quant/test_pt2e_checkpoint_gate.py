"""Issue 18's agreement gate on a reduced setting: SmolLM2-135M cut to its first 2 decoder
layers, 64 tokens of the evaluation text, calibration 4 x 64 tokens, the default
``CircleQuantizer()``, ``quant_target="onert"``: the onert file must agree with the
fake-quantized torch model on >= 98 % of top-1 tokens.

It does not (0.844 measured 2026-12-05): onert's uint8 FULLY_CONNECTED rounds twice where the
fake-quant rounds once (tests/quant/test_onert_fc_rounding.py), 0.4 % of layer-0 outputs move
by one step, later quantizations amplify that, and the uint8 logits (step 0.43) tie at the top
on 9 % of positions. The full model at 128 tokens: 0.781. docs/onert-findings.md has each
route's number; none reaches 0.98. Strict xfail: it fails loudly once the gate is met.
"""
from __future__ import annotations

import pytest
import torch

import checkpoint
import circle_fx

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not checkpoint.available(), reason=checkpoint.SKIP_REASON)]

LAYERS, TOKENS = 2, 64


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="onert vs fake-quant top-1 0.844 < 0.98 (2 layers, 64 tokens): onert's uint8 "
                                       "FULLY_CONNECTED double rounding, amplified; docs/onert-findings.md")
def test_onert_agrees_with_fake_quant_on_smollm2_cut():
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
    prepared = prepare_pt2e(gm, CircleQuantizer())
    with torch.no_grad():
        for ids in cal:
            prepared(ids)
        converted = convert_pt2e(prepared)
        fake_quant = converted(ev).numpy()
    (logits,) = circle_fx.export(converted, (ev,), quant_target="onert").run(ev)
    agreement = checkpoint.top1_agreement(logits, fake_quant)
    print(f"SmolLM2 cut to {LAYERS} layers, {TOKENS} tokens: onert vs fake-quant top-1 {agreement:.3f}")
    assert agreement >= 0.98
