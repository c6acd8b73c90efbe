"""The ``silu`` family (circle_fx/fusions/silu.py): ``x * sigmoid(x)`` -> ``circle.silu`` -> the
TANH form, and a CNN's layout kept through it because the op is declared ``elementwise``."""
from __future__ import annotations

import numpy as np
import torch

import circle_fx
from circle_fx.fusions.silu import silu
from circle_fx.op_traits import ELEMENTWISE

from onert_eager import assert_onert_matches_eager


class SwishCNN(torch.nn.Module):
    """The issue's case: a hand-written swish between two convolutions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        h = self.c1(x)
        return self.c2(h * torch.sigmoid(h))


def _fused(cm) -> list[str]:
    return [r.kind for r in cm.report.fusions]


def test_swish_between_convolutions_keeps_two_transposes():
    cm = assert_onert_matches_eager(SwishCNN(), (torch.randn(1, 3, 16, 16),), rtol=1e-4, atol=1e-5)
    hist = cm.op_histogram()
    assert hist["TRANSPOSE"] == 2 and hist["TANH"] == 1 and hist["LOGISTIC"] == 0, hist
    assert "silu" in _fused(cm)


def test_without_the_trait_the_layout_stops_at_the_op():
    """What the test above guards: an op the layout pass does not know as elementwise leaves
    a permute pair on each side of it."""
    ELEMENTWISE.discard(silu)
    try:
        cm = circle_fx.export(SwishCNN().eval(), (torch.randn(1, 3, 16, 16),))
    finally:
        ELEMENTWISE.add(silu)
    assert cm.op_histogram()["TRANSPOSE"] == 4


def test_tanh_form_matches_eager_on_an_mlp_activation():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) * x  # the other operand order

    x = torch.randn(1, 16, 96) * 4
    cm = circle_fx.export(M(), (x,))
    assert dict(cm.op_histogram()) == {"MUL": 2, "TANH": 1, "ADD": 1}
    got = cm.run(x.numpy())[0]
    np.testing.assert_allclose(got, torch.nn.functional.silu(x).numpy(), atol=5e-6)


def test_a_gate_is_not_a_swish():
    """``x * sigmoid(y)`` (a GLU-style gate) is another function: not fused."""
    class Gate(torch.nn.Module):
        def forward(self, x, y):
            return x * torch.sigmoid(y)

    cm = circle_fx.export(Gate(), (torch.randn(2, 8), torch.randn(2, 8)))
    assert "silu" not in _fused(cm) and cm.op_histogram()["LOGISTIC"] == 1


def test_readme_walk_through_is_the_file():
    """The README's "add a fusion" block is silu.py's code as it is (its docstring aside): the
    code the walk-through shows is the code every import runs; the block after it is executed
    by tests/passes/test_passes_api.py."""
    import pathlib

    import circle_fx.fusions.silu as module
    from readme import py_blocks, python_blocks

    src = pathlib.Path(module.__file__).read_text()
    code = src[src.index('"""', 3) + 3:].lstrip("\n")
    assert code in py_blocks()
    assert any("SwishCNN" in b and "fuse_silu" in b for b in python_blocks())
