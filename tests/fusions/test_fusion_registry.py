"""The fusion-family registry (``circle_fx.fusions``) and the one fusion log.

A tiny family (exact GELU, ``x * 0.5 * (1 + erf(x / sqrt 2))`` -> ``aten.gelu``) is
registered right here, in a few lines, to show what adding a family takes: the default
pipeline gains its fuse pass, the export fuses it (``erf``'s decomposition, EXP and
polynomials, is deferred past the fusions so the family sees the exact op) and runs in onert, and ``explain`` reports both the
fusion and a near miss, with no change to any circle_fx file.
"""
from __future__ import annotations

import ast
import gc
import importlib
import inspect
import math
import weakref

import numpy as np
import pytest
import torch

import circle_fx
import circle_fx.api
from circle_fx.fusions import Candidate, FusionFamily, families, get_family, register_family, unregister_family
from circle_fx.fx_utils import dtype_of, make_node
from circle_fx.patterns import Pattern, Rewrite

aten = torch.ops.aten

# ------------------------------------------------------------------ the tiny family


def _gelu_erf(x):
    return aten.mul.Tensor(aten.mul.Tensor(x, 0.5),
                           aten.add.Tensor(aten.erf.default(aten.div.Tensor(x, math.sqrt(2.0))), 1.0))


def _check_float(m):
    return None if dtype_of(m["x"]).is_floating_point else f"{dtype_of(m['x'])} is not a floating type"


def _replace(m, graph):
    return make_node(graph, aten.gelu.default, (m["x"],), like=m.root)


def _gelu_family():
    return FusionFamily("gelu_erf", [Rewrite("gelu_erf", Pattern(_gelu_erf), _replace, (_check_float,),
                                             produces="gelu")],
                        op=aten.gelu.default, title="GELU",
                        candidates=[Candidate(lambda n: n.target is aten.erf.default, hops=3)])


@pytest.fixture
def gelu_family():
    family = register_family(_gelu_family())
    try:
        yield family
    finally:
        unregister_family(family.name)


class ExactGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        return h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))


class WrongConstant(torch.nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / 2.0))


# ------------------------------------------------------------------------- tests


def test_builtin_rms_norm_family_owns_its_op_mapping_and_hints():
    rms = get_family("rms_norm")
    assert rms.op is torch.ops.circle.rms_norm.default
    assert aten.rms_norm.default in rms.composites
    assert rms.candidates and rms.pass_name == "fuse_rms_norm"
    assert rms.canonical, "RMSNorm's spelling rules belong to its family"


def test_every_public_fusions_module_registers_one_family():
    """No hand-kept list: each public file in circle_fx/fusions is a family, found by pkgutil."""
    import pathlib

    folder = pathlib.Path(circle_fx.__file__).parent / "fusions"
    names = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "registry"}
    owners = {importlib.import_module(f.rules[0].replace.__module__).__name__.rsplit(".", 1)[1]
              for f in families() if f.rules}
    assert names and owners == names, names ^ owners


def test_every_family_op_is_lowered_and_runs_in_eager():
    """A family's op has a lowering; a ``circle`` op is defined by its family module with an
    eager kernel (an aten op, as GELU's, has torch's own)."""
    from circle_fx.emit.registry import lowering_for

    for f in families():
        assert f.op is not None and lowering_for(f.op) is not None, f"{f.name}: {f.op} has no lowering"
        if f.op.namespace == "circle":
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f.op.name(), "CompositeExplicitAutograd"), f.name


def _code_without_docs(module) -> str:
    """The module's code with docstrings and comments removed (``ast.unparse`` drops comments)."""
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_explain_has_no_rms_norm_constants():
    # the module (the package attribute circle_fx.explain is the function)
    code = _code_without_docs(importlib.import_module("circle_fx.explain"))
    for word in ("rms_norm", "RMSNorm", "rsqrt", "REDUCTIONS", "SQUARE_LIKE", "HOPS", "aten", "torch.ops"):
        assert word not in code, word
    assert "families()" in code


def test_registered_family_gets_its_fuse_pass(gelu_family):
    names = circle_fx.default_pipeline().names()
    fuse = [f"fuse_{f.name}" for f in families()]
    assert fuse[-1] == "fuse_gelu_erf"
    head = ["decompose_composites", "rewrite_indexing", "complex_to_real", "decompose", "canonicalize",
            "fold_constants", "dce"]
    assert names[:len(head) + len(fuse) + 1] == [*head, *fuse, "merge_linears"]  # the layout passes follow


def test_unregistered_family_leaves_the_pipeline():
    assert "fuse_gelu_erf" not in circle_fx.default_pipeline().names()


def test_registering_a_name_again_warns(gelu_family):
    with pytest.warns(UserWarning, match="gelu_erf"):
        register_family(_gelu_family())


def test_registered_family_fuses_and_runs_in_onert(gelu_family):
    model, x = ExactGelu().eval(), torch.randn(2, 5, 16)
    cm = circle_fx.export(model, (x,))
    assert cm.op_histogram()["GELU"] == 1
    assert [(f.kind, f.rules) for f in cm.report.fusions] == [("gelu", ["gelu_erf"])]
    assert "fusions applied: 1" in cm.summary()
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(cm.run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_explain_reports_the_family_fusion_and_near_miss(gelu_family):
    fused = circle_fx.explain(ExactGelu(), (torch.randn(2, 16),))
    assert [(f.kind, f.rules) for f in fused.fused] == [("gelu", ["gelu_erf"])] and not fused.entries
    miss = circle_fx.explain(WrongConstant(), (torch.randn(2, 16),))
    assert not miss.fused
    (entry,) = miss.entries
    assert entry.kind == "gelu_erf" and entry.rule == "gelu_erf"
    assert "2.0" in entry.reason and "1.414" in entry.reason, entry.reason
    assert "test_fusion_registry.py" in entry.source and "torch.erf(x / 2.0)" in entry.source


# ----------------------------------------------------------------- the fusion log


class TwoNorms(torch.nn.Module):
    """One hand-written RMSNorm (fused by the rules) and one ``nn.RMSNorm`` (``aten.rms_norm``,
    mapped by the family's composite rule)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(16))
        self.norm = torch.nn.RMSNorm(16, eps=1e-6)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.norm(self.fc(h))


def test_fusion_count_equals_fused_ops_in_the_file(tmp_path):
    """Regression: the aten.rms_norm mapping made no record, so this printed
    "fusions applied: 1" for a file with 2 RMS_NORM operators."""
    from circle_fx.circle.reader import read_circle

    model, x = TwoNorms().eval(), torch.randn(2, 5, 16)
    cm = circle_fx.export(model, (x,))
    path = cm.save(tmp_path / "two.circle")
    in_file = [op.name for op in read_circle(path).operators].count("RMS_NORM")
    assert in_file == 2
    assert len(cm.report.fusions) == in_file
    assert f"fusions applied: {in_file}" in cm.summary()
    by_rule = {tuple(f.rules): f for f in cm.report.fusions}
    # the user's line that called nn.RMSNorm (torch's own F.rms_norm frame is skipped)
    assert "return self.norm(self.fc(h))" in by_rule[("aten.rms_norm",)].source
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(cm.run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_fusions_and_near_misses_live_in_one_store():
    class AxisOne(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)

    program = circle_fx.capture(AxisOne(), (torch.randn(2, 5, 16),))
    from circle_fx.explain import explain_program

    result = explain_program(program)
    assert program.fusion_log.near_misses and result.entries
    assert program.fusions() == program.fusion_log.fusions() == []


def test_circle_model_does_not_keep_the_fx_graph_alive():
    program = circle_fx.capture(TwoNorms().eval(), (torch.randn(2, 5, 16),))
    gm = weakref.ref(program.gm)
    cm = circle_fx.api.lower(program)
    del program
    gc.collect()
    assert gm() is None, "the exported CircleModel still references the GraphModule"
    assert len(cm.report.fusions) == 2 and "fusions applied: 2" in cm.summary()


def test_mapped_norm_that_absorbs_a_weight_stays_one_fusion():
    """``nn.RMSNorm`` without affine weight, times a weight: the mapping's record is merged
    into the weight rule's, not counted twice."""

    class NormThenScale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = torch.nn.RMSNorm(16, elementwise_affine=False)
            self.w = torch.nn.Parameter(torch.randn(16))

        def forward(self, x):
            return self.norm(x) * self.w

    model, x = NormThenScale().eval(), torch.randn(2, 5, 16)
    cm = circle_fx.export(model, (x,))
    assert dict(cm.op_histogram()) == {"RMS_NORM": 1}
    assert [f.rules for f in cm.report.fusions] == [["aten.rms_norm", "rms_norm_weight"]]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(cm.run(x)[0], want, rtol=1e-5, atol=1e-5)
