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
