"""export_llm + LLMRunner in onert against ``model.generate(do_sample=False)`` in transformers.

Same tokens for 32 new tokens, and the logits each token was picked from within 1e-4,
for a 1-token prompt, a prompt shorter than the prefill model (padding) and one longer
(the tail goes through decode steps), each with the prompt run through the prefill model
and through decode steps only. Gemma3's sliding window (6) is shorter than the
context, so its per-layer-type masks are exercised, not just present.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from llm_models import tiny

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
    ids = torch.tensor([PROMPTS[prompt]])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                             output_scores=True, return_dict_in_generate=True)
    want = ref.sequences[0].tolist()
    assert len(want) == len(ids[0]) + NEW
    for use_prefill in (True, False):  # the prompt through the prefill model, or through decode steps
        got, logits = runner.generate(ids, NEW, eos_token_ids=[], return_logits=True, use_prefill=use_prefill)
        where = f"{family}/{prompt}/prefill={use_prefill}"
        assert got == want, f"{where}: onert {got[len(ids[0]):]} vs transformers {want[len(ids[0]):]}"
        diff = max(float(np.abs(g - s[0].numpy()).max()) for g, s in zip(logits, ref.scores))
        assert diff < 1e-4, f"{where}: logits differ by {diff}"
