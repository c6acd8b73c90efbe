"""The forms onert runs fastest. Each rewrite is checked where it matters: the
graph/op counts change as intended, and the Circle file still matches eager in onert.

- ``merge_linears``: sibling linears on one input become one linear + split (QKV and
  gate/up in a Llama), linears on different inputs or with mixed biases/markers stay apart,
  removing the pass from the pipeline turns it off;
- linear op form: FULLY_CONNECTED, 1x1 CONV_2D and BATCH_MATMUL each run in onert and match
  eager, and the automatic choice follows the measured crossover constants;
- ``fold_views`` + the emitter's peephole: reshape/transpose chains collapse (fewer ops,
  identical numbers).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import circle_fx
from circle_fx.emit import linear_form
from circle_fx.passes import FoldViews, MergeLinears, run_passes
from circle_fx.circle.reader import read_circle

from onert_eager import Fn, assert_onert_matches_eager

aten = torch.ops.aten
ATOL = 1e-4  # as tests/e2e/test_llama.py


def _linears(program) -> list:
    return [n for n in program.graph.nodes if n.op == "call_function" and n.target is aten.linear.default]


def _tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = LlamaForCausalLM(cfg).eval()
    return model, torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------ merge_linears
def test_merge_linears_merges_qkv_and_gate_up_in_a_llama():
    model, ids = _tiny_llama()
    program = circle_fx.capture(model, (ids,))
    assert len(_linears(program)) == 7 * 2 + 1  # q k v o gate up down per layer, lm_head
    run_passes(program, circle_fx.default_pipeline())
    lin = _linears(program)
    assert len(lin) == 4 * 2 + 1  # qkv, o, gate_up, down per layer, lm_head
    out_features = sorted(int(n.meta["val"].shape[-1]) for n in lin)
    assert out_features.count(32 + 16 + 16) == 2 and out_features.count(64 + 64) == 2
    cm = circle_fx.lower(program)
    (got,) = cm.run(ids)
    with torch.no_grad():
        want = model(ids).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    hist = cm.op_histogram()
    assert hist["FULLY_CONNECTED"] == 9 and hist["SPLIT"] == 2  # gate/up: two equal pieces


class Mixed(torch.nn.Module):
    """Four linears on ``x`` (two without bias, two with), one on ``y``, one on ``x`` whose
    weight is not a constant: only same-input, same-bias-kind constant linears merge."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8, bias=False)
        self.b = torch.nn.Linear(16, 12, bias=False)
        self.c = torch.nn.Linear(16, 4)
        self.d = torch.nn.Linear(16, 4)
        self.e = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x, y, w):
        return (self.a(x), self.b(x), self.c(x), self.d(x), self.e(y),
                torch.nn.functional.linear(x, w))


def test_merge_linears_groups_only_same_input_and_bias_kind():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(3, 16))
    program = circle_fx.capture(Mixed(), inputs)
    assert MergeLinears()(program)
    lin = _linears(program)
    # a+b merged (no bias), c+d merged (bias), e alone (other input), runtime-weight linear alone
    assert sorted(int(n.meta["val"].shape[-1]) for n in lin) == [3, 8, 8, 20]
    assert sum(1 for n in lin if n.args[2:] and n.args[2] is not None) == 1
    torch.manual_seed(0)
    m = Mixed()
    cm = assert_onert_matches_eager(m, inputs, rtol=0, atol=1e-5)
    assert cm.op_histogram()["FULLY_CONNECTED"] + cm.op_histogram()["CONV_2D"] == 3


def test_merge_linears_is_off_when_removed_from_the_pipeline():
    model, ids = _tiny_llama()
    pipe = circle_fx.default_pipeline().remove_pass("merge_linears")
    assert "merge_linears" not in pipe.names() and "merge_linears" in circle_fx.default_pipeline().names()
    program = circle_fx.capture(model, (ids,))
    run_passes(program, pipe)
    assert len(_linears(program)) == 15
    cm = circle_fx.export(model, (ids,), passes=pipe)
    assert cm.op_histogram()["FULLY_CONNECTED"] == 15 and cm.op_histogram()["SPLIT"] == 0


def test_merge_linears_keeps_differently_marked_weights_apart_and_carries_markers():
    """Another pass's markers (e.g. int8 quantization) must agree for a merge, and survive it."""
    torch.manual_seed(0)
    m = torch.nn.ModuleDict({"q": torch.nn.Linear(8, 4, bias=False), "k": torch.nn.Linear(8, 4, bias=False),
                             "v": torch.nn.Linear(8, 4, bias=False)})
    mod = Fn(lambda x: (m["q"](x), m["k"](x), m["v"](x)))
    mod.m = m
    x = torch.randn(1, 3, 8)
    program = circle_fx.capture(mod, (x,))
    weights = [n.args[1] for n in _linears(program)]
    for w, mark in zip(weights, ["int8", "int8", "float"]):
        w.meta["quantize"] = mark
    MergeLinears()(program)
    lin = _linears(program)
    assert sorted(int(n.meta["val"].shape[-1]) for n in lin) == [4, 8]
    merged = next(n for n in lin if n.meta["val"].shape[-1] == 8)
    assert merged.args[1].meta["quantize"] == "int8"
    # per-output-channel statistics of the merged weight are the members' concatenated
    w = program.constant(merged.args[1])
    np.testing.assert_array_equal(w.abs().amax(1).numpy(),
                                  torch.cat([m["q"].weight, m["k"].weight]).abs().amax(1).detach().numpy())
    out = program.run(x)
    for got, lin_mod in zip(out, (m["q"], m["k"], m["v"])):
        torch.testing.assert_close(got, lin_mod(x), rtol=0, atol=1e-6)


# ------------------------------------------------------------------ linear op form
def _force(form):
    def force_form(program) -> bool:
        for n in _linears(program):
            n.meta[linear_form.META_KEY] = form
        return False
    return force_form


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("form", linear_form.FORMS)
def test_each_linear_form_runs_in_onert_and_matches_eager(form, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40, bias=bias)
    x = torch.randn(2, 7, 48)
    pipe = circle_fx.default_pipeline()
    pipe.append(_force(form))
    cm = assert_onert_matches_eager(lin, (x,), rtol=0, atol=1e-5, passes=pipe)
    want = {linear_form.FULLY_CONNECTED: "FULLY_CONNECTED", linear_form.CONV_2D: "CONV_2D",
            linear_form.BATCH_MATMUL: "BATCH_MATMUL"}[form]
    hist = cm.op_histogram()
    assert hist[want] == 1 and hist["TRANSPOSE"] == 0, dict(hist)
    if form == linear_form.CONV_2D:
        cf = read_circle(cm.to_bytes())
        (conv,) = [op for op in cf.operators if op.name == "CONV_2D"]
        # the filter is the torch weight's own bytes, [out, 1, 1, in]: laid out at compile time
        np.testing.assert_array_equal(cf.tensor_data(conv.inputs[1]).reshape(40, 48), lin.weight.detach().numpy())


def test_automatic_form_follows_the_measured_crossover():
    C = linear_form
    assert C.choose(None, 768, 768) == C.FULLY_CONNECTED  # dynamic rows: correct for any count
    assert C.choose(1, 768, 2048) == C.FULLY_CONNECTED  # decode: CONV_2D loses at S = 1
    assert C.choose(1, 768, C.CONV_MIN_OUT_FEATURES) == C.CONV_2D  # ... except on a vocabulary-wide weight
    assert C.choose(C.CONV_MIN_ROWS - 1, 768, 2048) == C.FULLY_CONNECTED
    assert C.choose(C.CONV_MIN_ROWS, 768, 2048) == C.CONV_2D
    assert C.choose(128, 8, 8) == C.FULLY_CONNECTED  # too small to pay CONV_2D's fixed cost


def test_automatic_conv_form_in_onert_matches_eager():
    torch.manual_seed(0)
    lin = torch.nn.Linear(768, 768)
    x = torch.randn(1, linear_form.CONV_MIN_ROWS, 768)
    cm = assert_onert_matches_eager(lin, (x,), rtol=0, atol=1e-4)
    assert cm.op_histogram()["CONV_2D"] == 1 and cm.op_histogram()["FULLY_CONNECTED"] == 0


def test_dynamic_rows_keep_fully_connected():
    torch.manual_seed(0)
    lin = torch.nn.Linear(768, 768)
    x = torch.randn(1, 64, 768)
    seq = torch.export.Dim("seq", min=2, max=256)
    cm = circle_fx.export(lin, (x,), dynamic_shapes=({1: seq},))
    assert cm.op_histogram()["FULLY_CONNECTED"] == 1 and cm.op_histogram()["CONV_2D"] == 0
    for n in (64, 5):
        xn = torch.randn(1, n, 768)
        (got,) = cm.run(xn)
        np.testing.assert_allclose(got, lin(xn).detach().numpy(), rtol=0, atol=1e-4)


# ------------------------------------------------------------------ folding views
class Views(torch.nn.Module):
    def forward(self, x, y):
        a = x.view(2, 3, 4, 5).reshape(6, 20).view(2, 3, 20)  # reshape chain -> one RESHAPE
        b = x.transpose(1, 2).transpose(1, 2) * 2  # cancels
        c = y.permute(0, 2, 1).permute(2, 0, 1)  # composes into one permute
        d = x.unsqueeze(0).squeeze(0) + 1  # cancels
        e = x.reshape(2, 3, 20)  # to its own shape
        return a + e, b, c, d


def test_fold_views_drops_ops_and_keeps_numbers():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 20), torch.randn(4, 5, 6))
    # the layout pass composes permutes of permutes too (so later ops see the result): off as well
    off = circle_fx.default_pipeline().remove_pass("fold_views").remove_pass("layout_nhwc")
    before = circle_fx.export(Views(), inputs, passes=off)
    after = assert_onert_matches_eager(Views(), inputs, rtol=0, atol=0)
    n_before, n_after = sum(before.op_histogram().values()), sum(after.op_histogram().values())
    assert after.op_histogram()["TRANSPOSE"] == 1 and after.op_histogram()["RESHAPE"] <= 1, after.op_histogram()
    assert n_after < n_before
    for got, want in zip(after.run(*inputs), before.run(*inputs)):
        np.testing.assert_array_equal(got, want)
    program = circle_fx.capture(Views(), inputs)
    assert FoldViews()(program)
    for got, want in zip(program.run(*inputs), Views()(*inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fold_views_turns_repeat_kv_into_one_gather():
    """transformers' repeat_kv (unsqueeze, expand, reshape) -> one GATHER with an interleaved index."""
    def repeat_kv(k):
        b, h, s, d = k.shape
        return k[:, :, None, :, :].expand(b, h, 3, s, d).reshape(b, h * 3, s, d) * 2

    torch.manual_seed(0)
    k = torch.randn(1, 2, 5, 4)
    cm = assert_onert_matches_eager(Fn(repeat_kv), (k,), rtol=0, atol=0)
    hist = cm.op_histogram()
    assert hist["GATHER"] == 1 and hist["BROADCAST_TO"] == 0 and hist["RESHAPE"] == 0, dict(hist)
    off = circle_fx.export(Fn(repeat_kv), (k,), passes=circle_fx.default_pipeline().remove_pass("fold_views"))
    assert off.op_histogram()["BROADCAST_TO"] == 1 and sum(off.op_histogram().values()) > sum(hist.values())


def test_merge_linears_concatenates_per_channel_quantization():
    """A quantization pass that ran first: per-output-channel scales concatenate in member
    order; per-tensor scales merge only when equal."""
    from circle_fx.circle.schema import QuantParams
    from circle_fx.meta import QUANT_META

    torch.manual_seed(0)
    m = torch.nn.ModuleDict({k: torch.nn.Linear(8, n, bias=False) for k, n in (("q", 4), ("k", 2), ("v", 2))})
    mod = Fn(lambda x: (m["q"](x), m["k"](x), m["v"](x)))
    mod.m = m
    x = torch.randn(1, 3, 8)

    def scales(w):
        return tuple((w.abs().amax(1) / 127).tolist())

    program = circle_fx.capture(mod, (x,))
    for n in _linears(program):
        w = program.constant(n.args[1])
        n.args[1].meta[QUANT_META] = QuantParams(scales(w), (0,) * w.shape[0], axis=0)
    MergeLinears()(program)
    (merged,) = _linears(program)
    q = merged.args[1].meta[QUANT_META]
    stacked = torch.cat([m["q"].weight, m["k"].weight, m["v"].weight]).detach()
    assert q == QuantParams(scales(stacked), (0,) * 8, axis=0)  # == quantizing the merged weight per row

    program = circle_fx.capture(mod, (x,))
    for n, s in zip(_linears(program), (0.1, 0.1, 0.2)):
        n.args[1].meta[QUANT_META] = QuantParams((s,), (0,))
    MergeLinears()(program)
    lin = _linears(program)
    assert sorted(int(n.meta["val"].shape[-1]) for n in lin) == [2, 6]  # q+k share scale 0.1, v alone
    assert next(n for n in lin if n.meta["val"].shape[-1] == 6).args[1].meta[QUANT_META] == QuantParams((0.1,), (0,))
