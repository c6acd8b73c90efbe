"""The pattern language on its own (``circle_fx.patterns``): matching rules, failure
reasons, and ``FusePatterns`` running a user-written rule in a user pipeline.

Target graphs come from ``circle_fx.capture`` of tiny modules (so nodes carry the same
``val`` / ``stack_trace`` metadata as in a real export); patterns are plain functions of
aten ops. Each matching rule is tested in both directions: the case it must accept and
the case it must refuse (with the reason ``explain`` would show).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.errors import UnsupportedOpError
from circle_fx.fx_utils import dtype_of, make_node
from circle_fx.op_traits import CAST
from circle_fx.passes import FusePatterns
from circle_fx.patterns import Match, MatchFailure, Pattern, Rewrite, apply, match, optional_cast, try_rewrite
from circle_fx.source import source_line
from onert_eager import Fn

aten = torch.ops.aten


def graph_of(fn, *shapes, dtype=torch.float32):
    """The captured graph of ``fn`` (no passes run) and its placeholders."""
    program = circle_fx.capture(Fn(fn), tuple(torch.randn(*s).to(dtype) for s in shapes))
    return program, [n for n in program.graph.nodes if n.op == "placeholder"]


def node(program, target, k=0):
    return [n for n in program.graph.nodes if n.op == "call_function" and n.target is target][k]


def output_node(program):
    out = program.graph.output_node().args[0]
    return out[0] if isinstance(out, (tuple, list)) else out


# ---------------------------------------------------------------------- patterns


def swish(x):
    return aten.mul.Tensor(x, aten.sigmoid.default(x))


def shifted_relu(x, y):
    return aten.add.Tensor(x, aten.relu.default(y))


def minus_relu(x, y):
    return aten.sub.Tensor(x, aten.relu.default(y))


def square_mean(x, dims, keepdim):
    return aten.mean.dim(aten.pow.Tensor_Scalar(optional_cast(x), 2), dims, keepdim)


def relu_squared(x):
    r = aten.relu.default(x)
    return aten.mul.Tensor(r, r)


def doubled(x):
    return aten.mul.Tensor(x, 2.0)


def last_mean(x):
    return aten.mean.dim(x, [-1], True)


# --------------------------------------------------------------- commutativity


@pytest.mark.parametrize("fn", [lambda x: x * torch.sigmoid(x), lambda x: torch.sigmoid(x) * x],
                         ids=["x*sigmoid(x)", "sigmoid(x)*x"])
def test_mul_matches_in_either_operand_order(fn):
    program, (x,) = graph_of(fn, (2, 8))
    m = match(Pattern(swish), output_node(program))
    assert m, m.reason
    assert m["x"] is x
    assert {n.target for n in m.nodes} == {aten.mul.Tensor, aten.sigmoid.default}


@pytest.mark.parametrize("fn", [lambda a, b: a + torch.relu(b), lambda a, b: torch.relu(b) + a],
                         ids=["a+relu(b)", "relu(b)+a"])
def test_add_matches_in_either_operand_order(fn):
    program, (a, b) = graph_of(fn, (2, 8), (2, 8))
    m = match(Pattern(shifted_relu), output_node(program))
    assert m, m.reason
    assert m["x"] is a and m["y"] is b


def test_sub_is_not_commutative():
    program, _ = graph_of(lambda a, b: torch.relu(b) - a, (2, 8), (2, 8))
    m = match(Pattern(minus_relu), output_node(program))
    assert not m and isinstance(m, MatchFailure)
    assert "expected aten.relu" in m.reason, m.reason
    program, (a, b) = graph_of(lambda a, b: a - torch.relu(b), (2, 8), (2, 8))
    m = match(Pattern(minus_relu), output_node(program))
    assert m and m["x"] is a and m["y"] is b


# ---------------------------------------------------------------- optional_cast


def test_optional_cast_present():
    program, (x,) = graph_of(lambda x: x.float().pow(2).mean(-1, keepdim=True), (2, 8), dtype=torch.float16)
    m = match(Pattern(square_mean), output_node(program))
    assert m, m.reason
    assert m["x"] is x and dtype_of(m["x"]) == torch.float16  # bound to the value *before* the cast
    assert any(n.target in CAST for n in m.nodes)  # the cast is part of the match
    assert m["dims"] == [-1] and m["keepdim"] is True


def test_optional_cast_absent():
    program, (x,) = graph_of(lambda x: x.pow(2).mean(-1, keepdim=True), (2, 8))
    m = match(Pattern(square_mean), output_node(program))
    assert m, m.reason
    assert m["x"] is x
    assert {n.target for n in m.nodes} == {aten.pow.Tensor_Scalar, aten.mean.dim}


# ------------------------------------------------------------------ shared nodes


def test_wildcard_used_twice_binds_one_value():
    program, _ = graph_of(lambda a, b: a * torch.sigmoid(b), (2, 8), (2, 8))
    m = match(Pattern(swish), output_node(program))
    assert not m
    assert "'x' must be one value" in m.reason, m.reason


def test_pattern_node_reached_twice_must_be_one_target_node():
    def shared(x):
        r = torch.relu(x)
        return r * r

    program, (x,) = graph_of(shared, (2, 8))
    m = match(Pattern(relu_squared), output_node(program))
    assert m, m.reason
    assert m["x"] is x and [n.target for n in m.nodes].count(aten.relu.default) == 1

    program, _ = graph_of(lambda x: torch.relu(x) * torch.relu(x), (2, 8))  # two relu nodes
    assert len([n for n in program.graph.nodes if n.target is aten.relu.default]) == 2
    m = match(Pattern(relu_squared), output_node(program))
    assert not m
    assert "expected the same aten.relu.default node twice" in m.reason, m.reason


# ---------------------------------------------------------------------- literals


def test_scalar_literal_must_match_exactly():
    program, (x,) = graph_of(lambda x: x * 2.0, (2, 8))
    assert match(Pattern(doubled), output_node(program))["x"] is x
    program, _ = graph_of(lambda x: x * 2.5, (2, 8))
    m = match(Pattern(doubled), output_node(program))
    assert not m
    assert "found 2.5 where the pattern has 2.0" in m.reason, m.reason


def test_list_and_bool_literals_must_match_exactly():
    program, _ = graph_of(lambda x: x.mean(-1, keepdim=True), (2, 8))
    assert match(Pattern(last_mean), output_node(program))
    program, _ = graph_of(lambda x: x.mean(-1, keepdim=False), (2, 8))
    m = match(Pattern(last_mean), output_node(program))
    assert not m and "where the pattern has True" in m.reason, m.reason
    program, _ = graph_of(lambda x: x.mean(0, keepdim=True), (2, 8))
    m = match(Pattern(last_mean), output_node(program))
    assert not m and "where the pattern has -1" in m.reason, m.reason


# --------------------------------------------------------------- the leak rule


def test_inner_node_used_outside_the_match_refuses():
    def leaks(x):
        s = torch.sigmoid(x)
        return x * s, s + 1.0

    program, _ = graph_of(leaks, (2, 8))
    m = match(Pattern(swish), node(program, aten.mul.Tensor))
    assert not m
    assert "is also used outside the pattern by" in m.reason and "add" in m.reason, m.reason
    assert m.progress == Pattern(swish).size + 1  # the whole shape matched: a leak outranks partial matches


def test_root_may_have_outside_users():
    def root_used_twice(x):
        y = x * torch.sigmoid(x)
        return y, y + 1.0

    program, _ = graph_of(root_used_twice, (2, 8))
    assert match(Pattern(swish), node(program, aten.mul.Tensor))


# ------------------------------------------------------------ failure reasons


def test_match_failure_is_falsy_and_names_where_it_failed():
    program, _ = graph_of(lambda x: x * torch.tanh(x), (2, 8))
    root = output_node(program)
    m = match(Pattern(swish), root)
    assert isinstance(m, MatchFailure) and not m
    assert m.root is root and m.at is node(program, aten.tanh.default)
    assert "expected aten.sigmoid.default, found %tanh = aten.tanh.default" in m.reason, m.reason
    assert source_line(m.at) != "<unknown source>"
    assert m.describe() == f"swish: {m.reason} at {source_line(m.at)}"
    assert m.progress == 1 and m.check is None


def test_failed_check_is_reported_with_its_name():
    def must_be_2d(m):
        return None if len(m["x"].meta["val"].shape) == 2 else "x is not 2-D"

    rule = Rewrite("swish", Pattern(swish), lambda m, g: m.root, (must_be_2d,))
    program, _ = graph_of(lambda x: x * torch.sigmoid(x), (2, 3, 8))
    m = try_rewrite(rule, output_node(program))
    assert not m and m.reason == "x is not 2-D" and m.check == "must_be_2d"
    assert m.progress == Pattern(swish).size + 1
    program, _ = graph_of(lambda x: x * torch.sigmoid(x), (2, 8))
    assert isinstance(try_rewrite(rule, output_node(program)), Match)


def test_apply_replaces_the_root_and_erases_the_match():
    rule = Rewrite("swish", Pattern(swish), lambda m, g: make_node(g, aten.silu.default, (m["x"],), like=m.root))
    program, (x,) = graph_of(lambda x: x * torch.sigmoid(x) + 1.0, (2, 8))
    inp = torch.randn(2, 8)
    want = program.run(inp)[0]
    new = apply(rule, try_rewrite(rule, node(program, aten.mul.Tensor)))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets == [aten.silu.default, aten.add.Tensor] and new.args == (x,)
    torch.testing.assert_close(program.run(inp)[0], want)


# ------------------------------------------- FusePatterns with a user-written rule


def exact_gelu(x):
    return aten.mul.Tensor(aten.mul.Tensor(x, 0.5),
                           aten.add.Tensor(aten.erf.default(aten.div.Tensor(x, math.sqrt(2.0))), 1.0))


USER_RULE = Rewrite("user_gelu", Pattern(exact_gelu),
                    lambda m, g: make_node(g, aten.gelu.default, (m["x"],), like=m.root), produces="gelu")


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = self.up(x)
        return self.down(h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0))))


def test_fuse_patterns_with_a_user_rule_in_a_user_pipeline_runs_in_onert():
    model, x = Mlp().eval(), torch.randn(2, 5, 16)
    plain = circle_fx.export(model, (x,))  # without the rule erf lowers as EXP and polynomials
    assert "GELU" not in plain.op_histogram() and plain.op_histogram()["EXP"] == 1
    pipeline = circle_fx.default_pipeline().insert_after("fuse_rms_norm", FusePatterns([USER_RULE], name="fuse_gelu"))
    cm = circle_fx.export(model, (x,), passes=pipeline)
    assert cm.op_histogram()["GELU"] == 1
    assert [(f.kind, f.rules) for f in cm.report.fusions] == [("gelu", ["user_gelu"])]
    assert "fuse_gelu" in cm.report.pass_timings
    with torch.no_grad():
        want = model(x).numpy()
    got = cm.run(x)[0]
    assert float(np.abs(want).max()) > 1e-2  # the comparison can fail
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_moved_sees_through_data_movement_chains_longest_first():
    """``moved(x)`` matches ``x`` after any chain of view/transpose/expand ops (covered by the
    match), or with none; a non-movement op in the chain ends it."""
    from circle_fx.patterns import moved

    def pat(w, a):
        return aten.mul.Tensor(moved(aten.neg.default(a)), w)

    p = Pattern(pat)
    program, (x, w) = graph_of(lambda x, w: (-x).view(2, 3).transpose(0, 1).reshape(6) * w, (3, 2), (6,))
    m = match(p, output_node(program))
    assert m and m["a"] is x and {n.target for n in m.nodes} >= {aten.view.default, aten.transpose.int}
    program, (x, w) = graph_of(lambda x, w: -x * w, (6,), (6,))
    assert match(p, output_node(program))
    program, (x, w) = graph_of(lambda x, w: (-x).exp().view(6) * w, (3, 2), (6,))
    assert not match(p, output_node(program))
