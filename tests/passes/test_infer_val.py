"""``fx_utils.infer_val``'s memo: nodes whose inputs have equal signatures share one fake
value, but only a plain one; a data-dependent size or a view must stay per node."""
from __future__ import annotations

import torch

from circle_fx.fx_utils import make_node

aten = torch.ops.aten


class _Two(torch.nn.Module):
    def forward(self, x, y):
        return x + 1, y + 1


def _graph():
    g = torch.export.export(_Two(), (torch.randn(4), torch.randn(4))).graph_module.graph
    return g, [n for n in g.nodes if n.op == "placeholder"], next(n for n in g.nodes if n.op == "output")


def test_equal_signatures_share_a_plain_value():
    g, (x, y), out = _graph()
    with g.inserting_before(out):
        a, b = make_node(g, aten.neg.default, (x,)), make_node(g, aten.neg.default, (y,))
    assert a.meta["val"] is b.meta["val"]


def test_unbacked_sizes_are_not_shared():
    """Two ``nonzero`` counts are different symbols: sharing one would tell the shape env
    they are equal."""
    g, (x, y), out = _graph()
    with g.inserting_before(out):
        a, b = make_node(g, aten.nonzero.default, (x,)), make_node(g, aten.nonzero.default, (y,))
    assert a.meta["val"] is not b.meta["val"]
    assert a.meta["val"].shape[0] is not b.meta["val"].shape[0]


def test_views_keep_their_own_base():
    g, (x, y), out = _graph()
    with g.inserting_before(out):
        a = make_node(g, aten.view.default, (x, [2, 2]))
        b = make_node(g, aten.view.default, (y, [2, 2]))
    assert a.meta["val"] is not b.meta["val"]
    assert b.meta["val"]._base is y.meta["val"]


class _Norm(torch.nn.Module):
    """An RMSNorm (fused: ``make_node`` memoizes fake values) before a linear, plus a folded constant."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(16))
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.fc(y) + torch.arange(16.0)


def _fake_modes() -> int:
    import gc

    from torch._subclasses.fake_tensor import FakeTensorMode

    gc.collect()
    return sum(isinstance(o, FakeTensorMode) for o in gc.get_objects())


def test_exports_do_not_keep_their_fake_modes():
    """The fake-value memo is kept per graph, so nothing of an export stays after it: keyed by
    the fake mode in a module-level WeakKeyDictionary, whose values (fake tensors) refer to the
    mode, every export's FakeTensorMode and fake values stayed for good (3 more after 3 exports).
    torch keeps the last export's graph (``proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT``,
    cleared when the next export starts), hence one allowed."""
    import circle_fx

    model, x = _Norm().eval(), torch.randn(2, 16)
    circle_fx.export(model, (x,), verbose=False)
    before = _fake_modes()
    for _ in range(3):
        circle_fx.export(model, (x,), verbose=False)
    assert _fake_modes() - before <= 1
