"""export_llm(quantize="int8-weights"): the decode and prefill models carry int8 weights and
still run token by token in onert, close to the float model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.errors import InputError

from llm_models import tiny


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=32, prefill_len=8, quantize="int8-weights")
    directory = tmp_path_factory.mktemp("llm_int8")
    pkg.save(directory)
    return model, pkg, directory


def test_both_models_store_int8_linear_weights(quantized):
    _, pkg, directory = quantized
    for part in ("decode", "prefill"):
        cf = read_circle(pkg.path(part))
        fc_weights = [cf.tensors[op.inputs[1]] for op in cf.operators if op.name == "FULLY_CONNECTED"]
        assert fc_weights and all(t.type_name == "INT8" for t in fc_weights), part
        assert sum(op.name == "RMS_NORM" for op in cf.operators) == 5, part


def test_quantized_decode_follows_the_float_model(quantized):
    model, pkg, directory = quantized
    runner = pkg.runner(directory)
    ids = [3, 17, 42, 5, 99, 64]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    got = [runner.step(t, p) for p, t in enumerate(ids)]
    got = np.stack(got)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 0.05, rel  # int8 weights + onert's per-row int8 activations: ~1-3% measured
    runner.reset()
    prefill = runner.run_prefill(ids)
    assert np.abs(prefill - got[-1]).max() / np.abs(got[-1]).max() < 0.02


def test_bad_quantize_value_fails_before_capture():
    with pytest.raises(InputError, match="int4"):
        circle_fx.export_llm(tiny("llama"), max_seq_len=16, quantize="int4")
