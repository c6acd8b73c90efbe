"""The linear-activation family: ReLU / ReLU6 after a linear becomes the fused activation of the
operator writing the linear's result (FULLY_CONNECTED, the 1x1 CONV_2D or BATCH_MATMUL's bias
ADD; with quantized weights the MUL / ADD after the hybrid int8 or GGML FULLY_CONNECTED).

Spellings fuse (no RELU / MAXIMUM / MINIMUM left) and onert's fused file equals, bit for bit,
the same model exported with the family removed (float: and eager within float noise); near
misses (other clamps, a linear read twice, a run-time weight) stay unfused, `explain` names
why, and still match; a hypothesis test checks that the fused graph computes the unfused model.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import circle_fx
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.emit import linear_form
from circle_fx.fusions.linear_activation import linear_act
from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes
from onert_eager import Fn

ACTS = {
    "relu": torch.relu, "relu6": F.relu6, "hardtanh": lambda y: F.hardtanh(y, 0.0, 6.0),
    "clamp06": lambda y: torch.clamp(y, 0, 6), "clamp_min0": lambda y: torch.clamp(y, min=0),
    "clamp04": lambda y: torch.clamp(y, 0, 4), "clamp_pm1": lambda y: torch.clamp(y, -1, 1),
}
FUSING = ("relu", "relu6", "hardtanh", "clamp06", "clamp_min0")


class LinAct(torch.nn.Module):
    def __init__(self, act="relu", n_in=64, n_out=24, bias=True, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(n_in, n_out, bias=bias)
        with torch.no_grad():
            self.fc.weight.mul_(8)  # results well below 0 and above 6: both bounds act
        self.act = ACTS[act]

    def forward(self, x):
        return self.act(self.fc(x))


def _force(form):
    def force_form(program) -> bool:
        for n in program.graph.nodes:
            if n.target is linear_act:
                n.meta[linear_form.META_KEY] = form
        return False
    return force_form


def _export(model, x, fuse=True, form=None, **kwargs):
    passes = default_pipeline()
    if not fuse:
        passes.remove_pass("fuse_linear_activation")
    if form is not None:
        passes.append(_force(form))
    return circle_fx.export(model, (x,), passes=passes, **kwargs)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("act", FUSING)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_spellings_fuse_and_equal_the_unfused_file_in_onert(act, bias):
    x = _x(2, 3, 64)
    model = LinAct(act, bias=bias)
    fused, plain = _export(model, x), _export(model, x, fuse=False)
    hist = fused.op_histogram()
    assert not {"RELU", "MAXIMUM", "MINIMUM"} & set(hist) and hist["FULLY_CONNECTED"] == 1, dict(hist)
    got = fused.run(x)[0]
    np.testing.assert_array_equal(got, plain.run(x)[0])  # onert's fused activation is exact
    want = model(x).detach().numpy()
    assert (want == 0).any() and (act not in ("relu6", "hardtanh", "clamp06") or (want == 6).any())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", [linear_form.CONV_2D, linear_form.BATCH_MATMUL])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_other_linear_forms_carry_the_activation(form, bias):
    x = _x(2, 3, 64)
    model = LinAct("relu6", bias=bias)
    fused, plain = _export(model, x, form=form), _export(model, x, fuse=False)
    hist = fused.op_histogram()
    assert not {"RELU", "MAXIMUM", "MINIMUM", "FULLY_CONNECTED"} & set(hist), dict(hist)
    assert hist["CONV_2D" if form == linear_form.CONV_2D else "BATCH_MATMUL"] == 1, dict(hist)
    np.testing.assert_allclose(fused.run(x)[0], plain.run(x)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("quantize", ["int8-weights", "q8_0", "q4_0"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_quantized_linears_keep_the_fused_activation(quantize, bias):
    """The weight-only pass reads ``circle.linear_act`` as a linear: the activation goes on the
    last operator of the hybrid int8 (FC -> MUL -> ADD) or GGML (FC -> ADD) chain, exact."""
    x = _x(4, 64)
    model = LinAct("relu6", bias=bias)
    fused, plain = _export(model, x, quantize=quantize), _export(model, x, fuse=False, quantize=quantize)
    hist = fused.op_histogram()
    assert not {"RELU", "MAXIMUM", "MINIMUM"} & set(hist), dict(hist)
    assert fused.op_histogram()["FULLY_CONNECTED"] == 1
    if quantize in ("q8_0", "q4_0") and ggml_unsupported_reason():
        pytest.skip(f"onert's GGML kernels do not run here: {ggml_unsupported_reason()}")
    got = fused.run(x)[0]
    np.testing.assert_array_equal(got, plain.run(x)[0])
    want, pre = model(x).detach().numpy(), model.fc(x).detach().numpy()
    assert np.abs(got - want).max() < 0.05 * np.abs(pre).max()  # the weight rounding only


def _near_miss(report, check=None, reason=None):
    return [m for m in report if m.kind == "linear_activation"
            and (check is None or m.check == check) and (reason is None or reason in m.reason)]


@pytest.mark.parametrize("act", ["clamp04", "clamp_pm1"])
def test_other_clamps_stay_unfused_name_their_check_and_still_match(act):
    x = _x(2, 64)
    model = LinAct(act)
    cm = _export(model, x)
    assert cm.op_histogram().get("MINIMUM") == 1
    np.testing.assert_allclose(cm.run(x)[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert _near_miss(circle_fx.explain(model, (x,)), check="_check_bounds")


class ReadTwice(torch.nn.Module):
    """``relu(y)`` and ``y`` itself: fusing would need a second, unfused copy of the linear."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 24)

    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y) + y


def test_a_linear_read_twice_stays_unfused_and_explain_says_why():
    x = _x(2, 64)
    model = ReadTwice()
    cm = _export(model, x)
    assert cm.op_histogram().get("RELU") == 1
    np.testing.assert_allclose(cm.run(x)[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert _near_miss(circle_fx.explain(model, (x,)), reason="also used outside"), \
        circle_fx.explain(model, (x,)).format()


def test_a_run_time_weight_stays_unfused_and_names_its_check():
    fn = Fn(lambda x, w: torch.relu(F.linear(x, w)))
    x, w = _x(2, 64), _x(24, 64, seed=1)
    cm = circle_fx.export(fn, (x, w))
    assert cm.op_histogram().get("RELU") == 1
    np.testing.assert_allclose(cm.run(x, w)[0], fn(x, w).numpy(), rtol=1e-5, atol=1e-4)
    assert _near_miss(circle_fx.explain(fn, (x, w)), check="_check_constant_weight")


@settings(max_examples=12, deadline=None)
@given(act=st.sampled_from(sorted(ACTS)), n_in=st.integers(1, 40), n_out=st.integers(1, 24),
       lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), bias=st.booleans(), seed=st.integers(0, 50))
def test_fused_graph_equals_the_unfused_model(act, n_in, n_out, lead, bias, seed):
    model = LinAct(act, n_in, n_out, bias, seed)
    x = torch.randn(*lead, n_in, generator=torch.Generator().manual_seed(seed))
    p = circle_fx.capture(model, (x,))
    run_passes(p, default_pipeline())
    run_passes(p, finalize_pipeline())
    fused = [r.kind for r in p.fusions()].count("linear_activation")
    assert fused == (act in FUSING)
    torch.testing.assert_close(p.run(x)[0], model(x), rtol=1e-5, atol=1e-5)


def _fc_activations(cm) -> list[int]:
    """``fused_activation_function`` of every FULLY_CONNECTED in the file."""
    from circle_fx.circle.reader import circle, read_circle

    out = []
    for op in read_circle(cm.to_bytes()).operators:
        if op.name == "FULLY_CONNECTED":
            table, opts = op.raw.BuiltinOptions(), circle.FullyConnectedOptions.FullyConnectedOptions()
            opts.Init(table.Bytes, table.Pos)
            out.append(opts.FusedActivationFunction())
    return out


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)
        with torch.no_grad():
            self.fc1.weight.mul_(8)

    def forward(self, x):
        return torch.relu(self.fc2(F.relu6(self.fc1(x))))


def test_pt2e_uint8_linears_fuse_their_activation_and_match_fake_quant():
    """``CircleQuantizer`` quantizes a linear's output after its ReLU / ReLU6; the family fuses
    them and the Q/DQ pass makes one uint8 FULLY_CONNECTED with the activation (onert clamps the
    uint8 result exactly), within one output step of the fake-quantized model."""
    from pt2e_util import quantize_pt2e

    model = TwoLayers().eval()
    x = _x(4, 64)
    fake = quantize_pt2e(model, (x,), [(_x(4, 64, seed=s),) for s in range(1, 5)],
                         circle_fx.quant.CircleQuantizer(skip=()))
    cm = circle_fx.export(fake, (x,), quant_target="onert", verbose=False)
    hist = cm.op_histogram()
    assert not {"RELU", "RELU6", "MAXIMUM", "MINIMUM"} & set(hist), dict(hist)
    assert _fc_activations(cm) == [3, 1]  # RELU6, RELU
    with torch.no_grad():
        want = fake(x).numpy()
    got = cm.run(x)[0]
    step = np.diff(np.unique(want)).min()
    assert (want == 0).any() and np.abs(got - want).max() <= 1.001 * step, np.abs(got - want).max() / step


def test_verify_refuses_a_fused_activation_on_a_ggml_fully_connected():
    """onert's ggml FULLY_CONNECTED ignores its fused activation (benchmarks/onert_fc_activation.py):
    the lowering puts it on an ADD of zeros instead, and ``verify`` names a file that does not."""
    from circle_schema.v0_10.circle.Model import ModelT
    import flatbuffers

    x = _x(4, 64)
    cm = _export(LinAct("relu", bias=False), x, quantize="q8_0")
    assert cm.op_histogram()["ADD"] == 1
    m = ModelT.InitFromPackedBuf(bytearray(cm.to_bytes()), 0)
    fc = next(op for op in m.subgraphs[0].operators if op.builtinOptions.__class__.__name__ == "FullyConnectedOptionsT")
    fc.builtinOptions.fusedActivationFunction = 1
    fb = flatbuffers.Builder(0)
    fb.Finish(m.Pack(fb), file_identifier=b"CIR0")
    with pytest.raises(circle_fx.VerifyError, match="GGML_Q8_0 weight with a fused activation"):
        circle_fx.circle.verify.verify(bytes(fb.Output()))
