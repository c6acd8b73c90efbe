"""GGML Q8_0 / Q4_0 weights on the real SmolLM2-135M-Instruct checkpoint (slow).

Perplexity on 512 tokens of ``pydoc_data.topics["execmodel"]`` against float32 in the same run:
q8_0 within 1 %, q4_0 within 8 % (the q4_0-mix preset, and every layer linear Q4_0 with calibrated
scales and an 8-bit lm_head). Measured on the exported graph (the file's exact weights,
dequantized, float activations) and, where onert's GGML kernels run (AVX-512 hosts), on the file
in onert; elsewhere the file must be refused with RuntimeFailure. Greedy generation with the Q8_0
weights must give the float model's first 32 new tokens.
"""
from __future__ import annotations

import pytest
import torch

import checkpoint
import circle_fx
from circle_fx import QuantConfig, RuntimeFailure
from circle_fx.circle import ggml
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.quant.ggml import pack

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not checkpoint.available(), reason=checkpoint.SKIP_REASON)]

BOUNDS = {"q8_0": 1.01, "q4_0-mix": 1.08, "q4_0 calibrated": 1.08}


@pytest.fixture(scope="module")
def reference():
    model, ids = checkpoint.load_model(), checkpoint.eval_ids(512)
    with torch.no_grad():
        return model, ids, checkpoint.perplexity(model(ids).logits, ids)


@pytest.fixture(scope="module")
def importance(reference):
    from circle_fx.quant import activation_importance

    return activation_importance(reference[0], checkpoint.calibration_ids())


# q4_0-mix keeps lm_head, down_proj and layers 0, 1, 28, 29 at Q8_0 (measured: graph +2.9 %, onert +3.7 %);
# plain q4_0 (every linear Q4_0, uncalibrated) is +31 % (graph 24.19 vs 18.44): over the 8 % goal, not
# tested here. "q4_0 calibrated": every layer linear and the embedding Q4_0 with scales weighted by
# activation importance from the calibration topics, lm_head Q8_0 (measured: graph and onert +5.9 %)
@pytest.mark.parametrize("kind", ["q8_0", "q4_0-mix", "q4_0 calibrated"])
def test_perplexity_within_bound_of_float(reference, importance, kind):
    model, ids, ppl_float = reference
    program = circle_fx.capture(model, (ids,), example_kwargs={"use_cache": False})
    quantize = QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q8_0", importance=importance) \
        if kind == "q4_0 calibrated" else kind
    cm = circle_fx.api.lower(program, quantize=quantize)
    with torch.no_grad():
        ppl_graph = checkpoint.perplexity(program.run(ids)[0], ids)
    assert ppl_graph <= BOUNDS[kind] * ppl_float, (ppl_graph, ppl_float)
    if ggml_unsupported_reason():
        with pytest.raises(RuntimeFailure, match="GGML"):
            cm.run(ids)
        return
    ppl_onert = checkpoint.perplexity(cm.run(ids)[0], ids)
    assert ppl_onert <= BOUNDS[kind] * ppl_float, (ppl_onert, ppl_float)


def test_q8_0_weights_generate_the_float_tokens(reference):
    """The same 32 greedy tokens after the chat prompt with every linear weight replaced by its
    Q8_0 blocks, dequantized (what the file stores; the input embedding is left float here).
    This prompt is not the benchmark's: on quant_accuracy.py's prompt the float model's own top-2
    margin is 0.007-0.02 logits at 3 of the 32 steps, below Q8_0's logit noise, and Q8_0 graphs keep
    7 to 32 tokens depending on which tensors are quantized (``benchmarks/greedy_margins.py``)."""
    import copy

    model = reference[0]
    tok = checkpoint.load_tokenizer()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is a Python code block?"}],
                                  add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:]
        q = copy.deepcopy(model)
        q.lm_head.weight = torch.nn.Parameter(q.lm_head.weight.clone())  # untie: the head is q8_0, the table not
        for mod in q.modules():
            if isinstance(mod, torch.nn.Linear):
                blocks, _, _ = pack(mod.weight, ggml.Q8_0)
                mod.weight.copy_(torch.from_numpy(ggml.dequantize(ggml.Q8_0, blocks.numpy(), mod.weight.shape)))
        got = q.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:]
    assert got.tolist() == want.tolist()
