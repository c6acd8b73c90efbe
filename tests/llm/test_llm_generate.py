"""export_llm + LLMRunner in onert against ``model.generate(do_sample=False)`` in transformers.

Same tokens for 32 new tokens, and the logits each token was picked from within 1e-4,
for a 1-token prompt, a prompt shorter than the prefill model (padding) and one longer
(the tail goes through decode steps), each with the prompt run through the prefill model
and through decode steps only. Gemma3's sliding window (6) is shorter than the
context, so its per-layer-type masks are exercised, not just present.
"""
from __future__ import annotations

import pytest

import circle_fx
from llm_models import greedy_reference, tiny

PROMPTS = {"one_token": [5], "padded": [5, 17, 9, 33, 2, 100], "longer_than_prefill": [5, 17, 9, 33, 2, 100, 7, 8, 9,
                                                                                     10, 11]}
NEW = 32


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def exported(request, tmp_path_factory):
    model = tiny(request.param)
    pkg = circle_fx.export_llm(model, max_seq_len=48, prefill_len=8)
    pkg.save(tmp_path_factory.mktemp(request.param))
    return request.param, model, pkg, pkg.runner()


def test_fused_ops(exported):
    family, model, pkg, _ = exported
    layers = model.config.num_hidden_layers
    decode, prefill = pkg.decode.op_histogram(), pkg.prefill.op_histogram()
    assert decode["ROPE"] == 2 * layers  # q and k of every layer
    assert prefill["ROPE"] == 0  # several positions: onert's ROPE would be wrong there
    assert decode["RMS_NORM"] >= 2 * layers + 1 and prefill["RMS_NORM"] == decode["RMS_NORM"]


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_same_tokens_as_transformers(exported, prompt):
    family, model, pkg, runner = exported
    greedy_reference().assert_generates_like_transformers(runner, model, [PROMPTS[prompt]], NEW, logit_tol=1e-4,
                                                          label=f"{family}/{prompt}")
