"""PAD above rank 4 (onert 0.1.0: "Padding for rank > 4 NYI" at run time): the ranks
legalization step merges neighbouring unpadded dims, so a 5-D or 6-D pad runs in onert and
matches eager; one that pads more dims than onert holds is an export error naming it, and
``op_table.rank_problem`` (what verify reports) names the limit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import circle_fx
from circle_fx.circle import op_table


class Pad(torch.nn.Module):
    def __init__(self, pads, value=0.0):
        super().__init__()
        self.pads, self.value = pads, value

    def forward(self, x):
        return F.pad(x * 2, self.pads, value=self.value)


@pytest.mark.parametrize("shape,pads,value", [
    ((2, 3, 4, 5, 6), [1, 2], 0.0),                 # last dim only
    ((2, 3, 4, 5, 6), [0, 0, 1, 1, 2, 0], 0.0),    # dims 2 and 3
    ((1, 2, 3, 2, 2, 3), [1, 0, 0, 0, 0, 0, 2, 1], 1.5),  # 6-D, PADV2
], ids=["5d_last", "5d_two_dims", "6d_value"])
def test_high_rank_pad_folds_and_matches_eager_in_onert(shape, pads, value):
    x = torch.randn(*shape)
    cm = circle_fx.export(Pad(pads, value), (x,))
    assert cm.op_histogram()["PAD" if value == 0 else "PADV2"] == 1  # verified at export: within limits
    np.testing.assert_allclose(cm.run(x)[0], Pad(pads, value)(x).numpy(), rtol=0, atol=0)


@pytest.mark.parametrize("pads", [[1, 1] * 5, [0, 0, 1, 1, 0, 0, 2, 0]], ids=["every_dim", "alternating"])
def test_pad_that_does_not_fold_into_rank_4_is_refused_with_the_limit(pads):
    with pytest.raises(circle_fx.CircleFxError, match="rank <= 4"):
        circle_fx.export(Pad(pads), (torch.randn(2, 3, 4, 5, 6),))


def test_rank_problem_names_the_pad_limit():
    assert "rank <= 4" in op_table.rank_problem("PAD", [[1, 2, 3, 4, 5], [5, 2]], [1, 2, 3, 4, 7])
    assert op_table.rank_problem("PADV2", [[2, 3, 4, 5], [4, 2], []], [2, 3, 4, 7]) is None
