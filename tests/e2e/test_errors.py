"""Every failure a user can cause gives one circle_fx exception naming the cause and where."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import (CaptureError, CircleFxError, InputError, PassError, UnsupportedDtypeError,
                       UnsupportedOpError)

aten = torch.ops.aten
HERE = "test_errors.py"


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.l(x)) * 2


def raised(fn, kind) -> CircleFxError:
    with pytest.raises(kind) as info:
        fn()
    err = info.value
    assert isinstance(err, CircleFxError)
    assert "Traceback" not in str(err)
    return err


# --------------------------------------------------------------------- capture
class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow
            return x * 2
        return x - 1


def test_data_dependent_control_flow_is_a_short_capture_error():
    err = raised(lambda: circle_fx.export(DataDependent(), (torch.randn(3),)), CaptureError)
    msg = str(err)
    assert len(msg.splitlines()) <= 6, msg
    assert "data-dependent" in msg
    assert f"{HERE}\", line" in msg and "if x.sum() > 0" in msg  # the user's line
    assert "torch.where" in msg  # the hint
    assert err.__cause__ is not None  # torch's full message stays reachable


class ShapeBug(nn.Module):
    def forward(self, x):
        return x @ torch.ones(3, 3)  # x is [2, 4]


def test_model_error_during_capture_names_the_line():
    err = raised(lambda: circle_fx.export(ShapeBug(), (torch.randn(2, 4),)), CaptureError)
    msg = str(err)
    assert "[2, 4] X [3, 3]" in msg
    assert f"{HERE}\", line" in msg and "return x @ torch.ones(3, 3)" in msg
    assert len(msg.splitlines()) <= 4


class MutatesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


def test_buffer_mutation_is_a_capture_error():
    err = raised(lambda: circle_fx.export(MutatesBuffer(), (torch.randn(2),)), CaptureError)
    assert "count" in str(err) and "stateless" in str(err)
    assert f"{HERE}:" in str(err) and "self.count.add_(1)" in str(err)


class InPlaceOnIntermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        h = self.l(x)
        h.mul_(3)
        return h


def test_inplace_ops_on_intermediates_are_functionalized():
    model = InPlaceOnIntermediate().eval()
    x = torch.randn(2, 4)
    cm = circle_fx.export(model, (x,))
    np.testing.assert_allclose(cm.run(x)[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------- inputs
@pytest.mark.parametrize("model, inputs, words", [
    (Lin(), (torch.randn(2, 4), torch.randn(2)), ["Lin.forward", "too many"]),
    (Lin(), (), ["Lin.forward", "missing"]),
    (Lin(), ("abc",), ["must be Tensor", "str"]),
    (Lin(), (np.zeros((2, 4), np.float32),), ["example_inputs[0]", "numpy", "torch.from_numpy"]),
    (Lin(), 5, ["tuple of tensors", "int"]),
    (Lin(), (torch.randn(2, 4, dtype=torch.complex64),), ["example_inputs[0]", "complex"]),
    (Lin(), (object(),), ["example_inputs[0]", "object"]),
    (lambda x: x, (torch.randn(2),), ["torch.nn.Module", "function"]),
])
def test_wrong_example_inputs_give_input_error(model, inputs, words):
    err = raised(lambda: circle_fx.export(model, inputs), InputError)
    for w in words:
        assert w in str(err), str(err)


def test_wrong_kwargs_give_input_error():
    err = raised(lambda: circle_fx.export(Lin(), (torch.randn(2, 4),), example_kwargs={"y": torch.randn(1)}),
                 InputError)
    assert "unexpected keyword" in str(err)


def test_dynamic_shapes_not_matching_inputs_give_input_error():
    from torch.export import Dim

    err = raised(lambda: circle_fx.export(Lin(), (torch.randn(2, 4),),
                                          dynamic_shapes=({0: Dim("b")}, {0: Dim("c")})), InputError)
    assert "dynamic_shapes does not match the example inputs" in str(err)
    assert len(str(err).splitlines()) == 1


def test_run_with_wrong_input_count(tmp_path):
    cm = circle_fx.export(Lin(), (torch.randn(2, 4),))
    err = raised(lambda: cm.run(torch.randn(2, 4), torch.randn(2, 4)), InputError)
    assert "takes 1 input" in str(err) and "'x'" in str(err)


def test_run_with_wrong_shape_or_dtype():
    """onert itself runs a [2, 5] input through a [2, 4] model without a word (garbage out)."""
    cm = circle_fx.export(Lin(), (torch.randn(2, 4),))
    err = raised(lambda: cm.run(torch.randn(2, 5)), InputError)
    assert "'x' has shape [2, 5]; the model expects [2, 4]" in str(err) and "dynamic_shapes" in str(err)
    err = raised(lambda: cm.run(torch.ones(2, 4, dtype=torch.int64)), InputError)
    assert "'x' has dtype int64; the model expects float32" in str(err)
    (out,) = cm.run(np.ones((2, 4), np.float64))  # same kind: converted
    assert out.dtype == np.float32 and out.shape == (2, 4)


# ---------------------------------------------------------------- unsupported
class Unsupported(nn.Module):
    def forward(self, x):
        a = torch.cumprod(x, -1)
        b = torch.erfinv(x)
        return a + b + torch.cumprod(b, 0)


def test_unsupported_ops_are_all_listed_with_source_lines():
    err = raised(lambda: circle_fx.export(Unsupported(), (torch.randn(3, 4),)), UnsupportedOpError)
    msg = str(err)
    assert "2 unsupported op(s), 3 node(s)" in msg and "nothing was written" in msg
    assert "aten.cumprod.default" in msg and "aten.erfinv.default" in msg
    assert "a = torch.cumprod(x, -1)" in msg and "torch.cumprod(b, 0)" in msg and "b = torch.erfinv(x)" in msg
    assert sorted(op for op, _, _ in err.ops) == ["aten.cumprod.default"] * 2 + ["aten.erfinv.default"]
    assert all(HERE in src for _, _, src in err.ops)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_unsupported_model_dtype_names_the_nodes(dtype):
    model = Lin().to(dtype)
    err = raised(lambda: circle_fx.export(model, (torch.randn(2, 4, dtype=dtype),)), UnsupportedDtypeError)
    msg = str(err)
    assert f"%x: {dtype} model input" in msg
    # the user's line that called the layer, not torch's own F.linear frame (the node is the
    # linear, or the linear_act fusion that took it and the relu)
    assert re.search(rf"%linear\w*: {re.escape(str(dtype))} at .*return torch.relu\(self.l\(x\)\) \* 2", msg), msg
    assert "torch/nn/modules/linear.py" not in msg
    assert "model.float()" in msg


class Float64Inside(nn.Module):
    def forward(self, x):
        return (x.double() * 2).float()


def test_unsupported_intermediate_dtype_names_the_line():
    err = raised(lambda: circle_fx.export(Float64Inside(), (torch.randn(2, 4),)), UnsupportedDtypeError)
    assert "torch.float64" in str(err) and "(x.double() * 2).float()" in str(err)


class ComplexInside(nn.Module):
    def forward(self, x):
        return torch.view_as_real(x.to(torch.complex64) * 2)


def test_complex_intermediate_is_reported():
    with pytest.raises((UnsupportedOpError, UnsupportedDtypeError)) as info:
        circle_fx.export(ComplexInside(), (torch.randn(2, 4),))
    assert "complex" in str(info.value) or "view_as_real" in str(info.value)
    assert HERE in str(info.value)


# ---------------------------------------------------------------------- passes
def boom(program):
    raise ValueError("boom")


def adds_node_without_meta(program):
    g = program.gm.graph
    relu = next(n for n in g.nodes if n.target is aten.relu.default)
    with g.inserting_after(relu):
        neg = g.call_function(aten.neg.default, (relu,))
    relu.replace_all_uses_with(neg)
    neg.args = (relu,)
    return True


def breaks_topological_order(program):
    g = program.gm.graph
    relu = next(n for n in g.nodes if n.target is aten.relu.default)
    with g.inserting_before(g.output_node()):
        neg = g.call_function(aten.neg.default, (relu,))
    neg.meta["val"] = relu.meta["val"]
    relu.args = (neg,)
    return True


def retargets_without_updating_meta(program):
    relu = next(n for n in program.gm.graph.nodes if n.target is aten.relu.default)
    relu.target = aten.sum.default
    return True


def drops_outputs(program):
    program.gm.graph.output_node().args = ((),)
    return True


@pytest.mark.parametrize("bad_pass, words", [
    (boom, ["'boom' raised ValueError: boom"]),
    (adds_node_without_meta, ["'adds_node_without_meta'", "%neg", "without meta['val']", "make_node"]),
    (breaks_topological_order, ["'breaks_topological_order' left the graph invalid", "used before"]),
    (retargets_without_updating_meta, ["'retargets_without_updating_meta'", "aten.sum.default",
                                       "computes torch.float32 []"]),
    (drops_outputs, ["'drops_outputs' changed the number of graph outputs"]),
    (42, ["not callable"]),
])
def test_bad_custom_pass_is_named(bad_pass, words):
    passes = circle_fx.default_pipeline()
    passes.insert_after("canonicalize", bad_pass)
    err = raised(lambda: circle_fx.export(Lin(), (torch.randn(2, 4),), passes=passes), PassError)
    msg = str(err)
    assert len(msg.splitlines()) <= 2, msg
    for w in words:
        assert w in msg, msg


def test_good_custom_pass_passes_checks():
    calls = []

    def count_nodes(program):
        calls.append(len(program.gm.graph.nodes))
        return False

    cm = circle_fx.export(Lin(), (torch.randn(2, 4),), passes=circle_fx.default_pipeline() + [count_nodes])
    assert calls and cm.op_histogram()["FULLY_CONNECTED"] == 1


def test_all_error_types_share_one_base():
    for cls in (CaptureError, InputError, PassError, UnsupportedDtypeError, UnsupportedOpError,
                circle_fx.VerifyError, circle_fx.RuntimeFailure):
        assert issubclass(cls, CircleFxError)
