"""The public pass API: the Pass protocol, ``export(passes=...)``, and editing the default
pipeline (``insert_after``/``insert_before``/``replace``/``remove_pass``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx import Pass, PassError, Pipeline, default_pipeline
from circle_fx.fx_utils import make_node
from circle_fx.fusions import families
from circle_fx.fusions.rms_norm import rms_norm
from circle_fx.passes import fuse_rms_norm, run_passes

aten = torch.ops.aten
D = 16


class NormThenDouble(torch.nn.Module):
    """A hand-written RMSNorm followed by ``* 2`` (something a user pass can rewrite)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(D, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return h * 2.0


@pytest.fixture
def model_and_input():
    return NormThenDouble().eval(), (torch.randn(2, 5, D),)


def _check_against_eager(cm, model, inputs):
    (got,) = cm.run(*inputs)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(*inputs).numpy(), rtol=0, atol=1e-5)


class DoubleToAdd(Pass):
    """``x * 2`` -> ``x + x``: an ordinary user rewrite, written against the Pass base."""

    name = "double_to_add"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def run(self, program) -> bool:
        self.calls += 1
        g = program.graph
        changed = False
        for n in list(g.nodes):
            if n.op == "call_function" and n.target is aten.mul.Tensor and n.args[1] == 2.0:
                with g.inserting_before(n):
                    new = make_node(g, aten.add.Tensor, (n.args[0], n.args[0]), like=n)
                n.replace_all_uses_with(new)
                g.erase_node(n)
                changed = True
        return changed


# ------------------------------------------------------------------------ the pipeline

def test_default_pipeline_is_a_fresh_editable_copy():
    a, b = default_pipeline(), default_pipeline()
    assert isinstance(a, Pipeline) and a is not b
    assert "fuse_rms_norm" in a.names() and "fold_constants" in a.names()
    assert a.names().index("canonicalize") < a.names().index("fuse_rms_norm")
    a.remove_pass("fuse_rms_norm")
    assert "fuse_rms_norm" not in a.names()
    assert "fuse_rms_norm" in default_pipeline().names()  # the default itself is untouched


def test_pipeline_edit_helpers():
    def first(program):
        return False

    def second(program):
        return False

    pipe = default_pipeline()
    n = len(pipe)
    assert pipe.insert_after("fuse_rms_norm", first) is pipe  # chainable
    names = pipe.names()
    assert names[names.index("fuse_rms_norm") + 1] == "first"
    pipe.insert_before("canonicalize", second)
    assert pipe.names()[pipe.names().index("canonicalize") - 1] == "second"
    pipe.replace("first", DoubleToAdd())
    assert "first" not in pipe.names() and "double_to_add" in pipe.names()
    pipe.remove_pass("second").remove_pass("double_to_add")
    assert len(pipe) == n
    with pytest.raises(KeyError, match="no_such_pass"):
        pipe.insert_after("no_such_pass", first)
    with pytest.raises(KeyError):
        pipe.remove_pass("no_such_pass")


# -------------------------------------------------------------------- user passes run

def test_user_pass_appended_to_default_runs_and_rewrites(model_and_input):
    model, inputs = model_and_input
    baseline = circle_fx.export(model, inputs)
    assert baseline.op_histogram()["MUL"] == 1 and baseline.op_histogram()["ADD"] == 0

    user = DoubleToAdd()
    pipe = default_pipeline().insert_after("fuse_rms_norm", user)
    cm = circle_fx.export(model, inputs, passes=pipe)
    assert user.calls == 1
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 1 and hist["MUL"] == 0 and hist["ADD"] == 1
    assert "double_to_add" in cm.report.pass_timings
    _check_against_eager(cm, model, inputs)


def test_plain_function_pass_sees_the_fused_program(model_and_input):
    model, inputs = model_and_input
    seen = []

    def record(program):
        assert isinstance(program, circle_fx.Program)
        seen.append([n.target for n in program.graph.nodes if n.op == "call_function"])
        return False

    circle_fx.export(model, inputs, passes=default_pipeline().insert_after("fuse_rms_norm", record))
    (targets,) = seen
    assert rms_norm in targets and aten.rsqrt.default not in targets


def test_user_pass_before_fusion_can_block_it(model_and_input):
    """Order matters: a pass inserted before fusion changes what fusion sees."""
    model, inputs = model_and_input

    def rsqrt_to_reciprocal_sqrt(program):
        g = program.graph
        for n in list(g.nodes):
            if n.target is aten.rsqrt.default:
                with g.inserting_before(n):
                    s = make_node(g, aten.sqrt.default, (n.args[0],), like=n)
                    r = make_node(g, aten.reciprocal.default, (s,), like=n)
                n.replace_all_uses_with(r)
                g.erase_node(n)
        return True

    after = default_pipeline().insert_after("canonicalize", rsqrt_to_reciprocal_sqrt)
    cm = circle_fx.export(model, inputs, passes=after)
    assert cm.op_histogram()["RMS_NORM"] == 0 and cm.report.fusions == []
    _check_against_eager(cm, model, inputs)
    # before canonicalize, canonicalize turns 1/sqrt back into rsqrt and fusion still applies
    before = default_pipeline().insert_before("canonicalize", rsqrt_to_reciprocal_sqrt)
    assert circle_fx.export(model, inputs, passes=before).op_histogram()["RMS_NORM"] == 1


def test_passes_list_replaces_the_default(model_and_input):
    model, inputs = model_and_input
    user = DoubleToAdd()
    cm = circle_fx.export(model, inputs, passes=[user])
    assert user.calls == 1
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 0 and hist["ADD"] >= 2  # eps add + the user's add
    _check_against_eager(cm, model, inputs)


def test_empty_passes_still_export_but_fuse_nothing(model_and_input):
    """Folding + DCE (the finalize pipeline) always run, fusion only on request."""
    model, inputs = model_and_input
    cm = circle_fx.export(model, inputs, passes=[])
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 0 and hist["RSQRT"] == 1 and hist["MEAN"] == 1
    assert cm.report.fusions == []
    assert "fusions applied: 0" in cm.summary()
    assert set(cm.report.pass_timings) >= {"fold_constants", "dce"}
    _check_against_eager(cm, model, inputs)


def test_remove_and_replace_fusion_in_default(model_and_input):
    model, inputs = model_and_input
    cm = circle_fx.export(model, inputs, passes=default_pipeline().remove_pass("fuse_rms_norm"))
    assert cm.op_histogram()["RMS_NORM"] == 0
    traced = fuse_rms_norm(record_failures=True)
    cm = circle_fx.export(model, inputs, passes=default_pipeline().replace("fuse_rms_norm", traced))
    assert cm.op_histogram()["RMS_NORM"] == 1


def test_run_passes_reports_whether_anything_changed(model_and_input):
    model, inputs = model_and_input
    program = circle_fx.capture(model, inputs)
    assert run_passes(program, [lambda p: False]) is False
    assert run_passes(program, default_pipeline()) is True
    assert run_passes(program, [fuse_rms_norm()]) is False  # nothing left to fuse


# ---------------------------------------------------------------------- failing passes

def test_pass_that_raises_gives_pass_error_naming_it(model_and_input):
    model, inputs = model_and_input

    def exploding_pass(program):
        raise ValueError("boom at node 3")

    with pytest.raises(PassError, match=r"exploding_pass.*ValueError: boom at node 3") as info:
        circle_fx.export(model, inputs, passes=default_pipeline().insert_after("canonicalize", exploding_pass))
    assert isinstance(info.value, circle_fx.CircleFxError)
    assert isinstance(info.value.__cause__, ValueError)

    class Broken(Pass):
        name = "my_broken_pass"

        def run(self, program):
            raise KeyError("x")

    with pytest.raises(PassError, match="my_broken_pass"):
        circle_fx.export(model, inputs, passes=[Broken()])


def test_pass_that_breaks_the_graph_is_caught(model_and_input):
    model, inputs = model_and_input

    def drop_outputs(program):
        program.graph.output_node().args = ((),)
        return True

    with pytest.raises(PassError, match=r"drop_outputs.*number of graph outputs"):
        circle_fx.export(model, inputs, passes=[drop_outputs])


def test_non_callable_pass_is_rejected(model_and_input):
    model, inputs = model_and_input
    with pytest.raises(PassError, match="not callable"):
        circle_fx.export(model, inputs, passes=["fuse_rms_norm"])


# ------------------------------------------------------------------------------ README

def test_readme_examples_run(tmp_path, monkeypatch, capsys):
    """The README's API and custom-pass examples are executed as written."""
    from readme import python_blocks

    blocks = python_blocks()
    assert len(blocks) >= 2 and any("insert_after" in b for b in blocks)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme_example"})
    assert (tmp_path / "llama.circle").exists()
    printed = capsys.readouterr().out
    names = default_pipeline().names()
    head = names.index(families()[0].pass_name)  # the decompose passes, canonicalize, fold, dce
    assert str(names[:head]) in printed
    assert any(f"# {names[:head]}" in b for b in blocks)  # the README comment shows the real pass names
    assert names[head:head + len(families())] == [f.pass_name for f in families()]  # "then fuse_<family> per family"
