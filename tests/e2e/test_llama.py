"""End to end: a 2-layer ``transformers`` Llama -> Circle -> onert, compared with eager.

The model is unpatched ``LlamaForCausalLM`` (random weights, ``use_cache=False``). What
must hold: every RMSNorm (2 per layer + the final one) becomes one RMS_NORM operator with
nothing of the decomposed form left, the logits match eager PyTorch within 1e-4, and the
weights in the file are the model's own tensors in Circle's layout (FULLY_CONNECTED
``[out, in]``, no TRANSPOSE of constants at run time).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.circle.runtime import OnertSession

from rms_cases import rms_epsilon

ATOL = 1e-4


def eager_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=ids).logits.numpy()


def test_every_rmsnorm_is_one_rms_norm_operator(tiny_llama, tiny_llama_circle):
    model, _ = tiny_llama
    hist = tiny_llama_circle.op_histogram()
    layers = model.config.num_hidden_layers
    assert hist["RMS_NORM"] == 2 * layers + 1 == 5
    # nothing of the decomposed spelling survives (attention uses none of these either)
    for leftover in ("POW", "RSQRT", "MEAN", "SQRT", "SQUARE", "SUM"):
        assert hist[leftover] == 0, (leftover, dict(hist))


def test_logits_match_eager(tiny_llama, tiny_llama_circle):
    model, (ids,) = tiny_llama
    (got,) = tiny_llama_circle.run(ids)
    want = eager_logits(model, ids)
    assert got.shape == want.shape == (1, ids.shape[1], model.config.vocab_size)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # a second, different input of the same shape through the same session
    other = torch.randint(0, model.config.vocab_size, ids.shape, generator=torch.Generator().manual_seed(7))
    assert not torch.equal(other, ids)
    (got2,) = tiny_llama_circle.run(other)
    np.testing.assert_allclose(got2, eager_logits(model, other), rtol=0, atol=ATOL)
    assert np.abs(got2 - got).max() > 1e-3  # the output really depends on the input


def test_inputs_and_outputs_are_named_after_the_model(tiny_llama_circle):
    cf = read_circle(tiny_llama_circle.to_bytes())
    assert [cf.tensors[i].name for i in cf.inputs] == ["input_ids"]
    assert [cf.tensors[i].name for i in cf.outputs] == ["logits"]
    assert [name for name, _ in cf.signature_outputs] == ["logits"]
    assert cf.tensors[cf.inputs[0]].type_name == "INT64"


def test_fully_connected_weights_are_the_linear_weights_untransposed(tiny_llama, tiny_llama_circle):
    model, _ = tiny_llama
    cf = read_circle(tiny_llama_circle.to_bytes())
    linears = {name: m.weight.detach().numpy() for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)}
    assert len(linears) == 7 * model.config.num_hidden_layers + 1  # q k v o gate up down, lm_head
    found = []
    fcs = [op for op in cf.operators if op.name == "FULLY_CONNECTED"]
    # merge_linears (default pipeline) stacks sibling weights (q/k/v, gate/up) along [out]:
    # an FC weight is one nn.Linear weight or several stacked in order, each row untouched
    for op in fcs:
        weight = cf.tensor_data(op.inputs[1])
        assert weight is not None, "FULLY_CONNECTED weight must be a constant in the file"
        row = 0
        while row < weight.shape[0]:
            matches = [n for n, w in linears.items() if w.shape[1] == weight.shape[1] and row + w.shape[0] <= weight.shape[0]
                       and np.array_equal(w, weight[row:row + w.shape[0]])]
            assert len(matches) == 1, f"FC weight {weight.shape} rows {row}.. are not exactly one nn.Linear weight [out, in]"
            found.append(matches[0])
            row += linears[matches[0]].shape[0]
        assert op.inputs[2] == -1  # Llama linears have no bias: the optional slot is -1
    assert sorted(found) == sorted(linears)  # every linear exactly once
    # weights are never transposed at run time: no TRANSPOSE reads a constant
    for op in cf.operators:
        if op.name == "TRANSPOSE":
            assert cf.tensor_data(op.inputs[0]) is None, f"TRANSPOSE #{op.index} reads a constant"


def test_rms_norm_operators_carry_the_norm_weights_and_eps(tiny_llama, tiny_llama_circle):
    model, _ = tiny_llama
    cf = read_circle(tiny_llama_circle.to_bytes())
    norms = [m.weight.detach().numpy() for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert len(norms) == 5
    ops = [op for op in cf.operators if op.name == "RMS_NORM"]
    assert len(ops) == len(norms)
    for op, want in zip(ops, norms):  # emitted in execution order, as the modules are listed
        np.testing.assert_array_equal(cf.tensor_data(op.inputs[1]), want)
        assert rms_epsilon(op) == pytest.approx(model.config.rms_norm_eps, rel=1e-6)


def test_embedding_table_stored_once_as_gather_params(tiny_llama, tiny_llama_circle):
    model, _ = tiny_llama
    cf = read_circle(tiny_llama_circle.to_bytes())
    # the one GATHER from a constant table (fold_views turns repeat_kv into GATHERs of activations)
    (gather,) = [op for op in cf.operators if op.name == "GATHER" and cf.tensor_data(op.inputs[0]) is not None]
    np.testing.assert_array_equal(cf.tensor_data(gather.inputs[0]), model.model.embed_tokens.weight.detach().numpy())
    # total constant bytes: the parameters plus small shape constants, nothing duplicated
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert param_bytes <= tiny_llama_circle.builder.weight_bytes() < param_bytes + 8 * 1024


def test_summary_lists_ops_weights_and_fusions_with_source(tiny_llama_circle):
    text = tiny_llama_circle.summary()
    assert "RMS_NORM" in text and "FULLY_CONNECTED" in text
    assert f"weight bytes: {tiny_llama_circle.builder.weight_bytes():,}" in text
    assert f"tensors: {len(tiny_llama_circle.builder.tensors)}" in text
    assert "fusions applied: 5" in text
    fusions = tiny_llama_circle.report.fusions
    assert len(fusions) == 5 and all(f.kind == "rms_norm" for f in fusions)
    for f in fusions:
        assert "modeling_llama.py:" in f.source and "rsqrt" in f.source
    assert "modeling_llama.py:" in text


def test_save_writes_exactly_to_bytes_and_runs(tmp_path, tiny_llama, tiny_llama_circle):
    model, (ids,) = tiny_llama
    path = tmp_path / "llama.circle"
    assert tiny_llama_circle.save(path) == str(path)
    data = path.read_bytes()
    assert data == tiny_llama_circle.to_bytes()
    assert data[4:8] == b"CIR0"
    assert os.listdir(tmp_path) == ["llama.circle"]  # no temp file left behind
    (got,) = OnertSession(str(path)).run([ids.numpy()])
    np.testing.assert_allclose(got, eager_logits(model, ids), rtol=0, atol=ATOL)


def test_without_passes_llama_still_exports_and_matches(tiny_llama):
    """``passes=[]``: no fusion at all, the decomposed norms are lowered op by op."""
    model, (ids,) = tiny_llama
    cm = circle_fx.export(model, (ids,), passes=[])
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 0 and cm.report.fusions == []
    assert hist["RSQRT"] == 5 and hist["MEAN"] == 5
    (got,) = cm.run(ids)
    np.testing.assert_allclose(got, eager_logits(model, ids), rtol=0, atol=ATOL)
