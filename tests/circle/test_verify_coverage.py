"""Every Circle op the emitter can produce has a verify shape rule, and the ARG_MAX rule
(the last one added) accepts what we emit and catches a wrong shape or index type."""
from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import torch

import circle_fx
from circle_fx.circle.schema import BO
from circle_fx.circle.verify import has_rule

circle_fx.load_compiler()  # builtin_targets sees only what is registered; import circle_fx is lazy

from test_verify import first_op, mutate, assert_problem

EMIT = pathlib.Path(circle_fx.__file__).parent / "emit"


def emitting_files() -> set[pathlib.Path]:
    """circle_fx/emit (emitter, legalization, lowerings) and the file of every built-in lowering
    the registry holds, wherever it is defined (quant/lowerings, a fusion family's module)."""
    from circle_fx.emit.registry import LOWERINGS, builtin_targets

    files = set(EMIT.rglob("*.py"))
    files |= {pathlib.Path(inspect.getsourcefile(importlib.import_module(LOWERINGS[t].__module__)))
              for t in builtin_targets()}
    return files


def emitted_ops() -> set[str]:
    """``BO.<NAME>`` attribute reads in every file that emits Circle operators."""
    names = set()
    for path in emitting_files():
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "BO":
                names.add(n.attr)
    return names


def test_every_emittable_op_has_a_verify_rule():
    ops = emitted_ops()
    assert {"ADD", "FULLY_CONNECTED", "ARG_MAX", "RMS_NORM", "QUANTIZE", "TANH"} <= ops, ops  # the scan finds them
    folders = {p.parent.name for p in emitting_files()}
    assert {"lowerings", "fusions", "legalize"} <= folders, folders
    missing = sorted(n for n in ops if not has_rule(getattr(BO, n)))
    assert not missing, f"ops the emitter produces without a verify rule: {missing}"


def _argmax_model():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.max(dim=-1).indices

    x = torch.randn(2, 3, 5)
    cm = circle_fx.export(M(), (x,))
    return cm.to_bytes()


def test_arg_max_rule():
    good = _argmax_model()
    report = circle_fx.verify(good)
    assert report.op_counts["ARG_MAX"] == 1

    def wrong_shape(m, sg):
        _, op = first_op(m, sg, "ARG_MAX")
        sg.tensors[op.outputs[0]].shape[-1] += 1
    assert_problem(mutate(good, wrong_shape), "ARG_MAX", "output shape")

    def wrong_type(m, sg):
        _, op = first_op(m, sg, "ARG_MAX")
        op.builtinOptions.outputType = 2  # INT32, while the tensor is INT64
    assert_problem(mutate(good, wrong_type), "ARG_MAX", "output_type")


def test_every_op_with_element_type_limits_has_a_rule():
    """verify checks the op table's element types inside the per-op rules: an op in the table
    without a rule would go unchecked."""
    from circle_fx.circle.op_table import ELEMENT_TYPES
    assert not [n for n in ELEMENT_TYPES if not has_rule(getattr(BO, n))]
