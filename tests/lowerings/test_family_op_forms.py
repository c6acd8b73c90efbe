"""Ops and op forms transformers families (docs/model-support.md) failed on, each written the
way the family writes it, run in onert against eager. Forms of ops that have a lowering but
that the lowering refused or onert 0.1.0 gets wrong:

- constant multi-result ops (``self.scale.unbind(0)``: DeepSeek-V4) fold per result;
- softmax over another axis than the last (DeepSeek-V4's compressor gate), a sum of a bool
  tensor (``(ids != pad).sum(-1)``: XLM, CPM-Ant): decomposed (``decompositions.REFUSED_FORMS``);
- a gather from an int64 constant table (DeepSeek-V4's token -> expert hash, RoBERTa's token
  type row): an int32 table; ``gather`` from one row is one GATHER;
- 5-D reductions and comparisons (onert rejects the first and computes the second wrongly):
  merged to at most 4 axes;
- integer ``&`` / ``|`` of 0/1 flags, ``cat`` / slices / ``expand`` of bool tensors (CPM-Ant, XLM:
  onert's CONCATENATION, STRIDED_SLICE and BROADCAST_TO have no bool kernel);
- ``topk`` on rows with fewer than k finite values (indices must stay distinct);
- ``const @ x`` (onert refuses a constant BATCH_MATMUL LHS: Inkling2's learned query);
- ``constant_pad_nd`` with negative amounts (RWKV's time shift crops): slices, then a pad.

Ops without a lowering, decomposed (``decompositions.DECOMPOSITIONS``): ``unfold`` (Inkling2's
short convolution windows); an einsum of non-contiguous views (ProphetNet: the decomposition
is traced on examples strided like the graph's values).

Tolerance 1e-5: transposes and reshapes move values exactly; integer results compare exactly.
"""
from __future__ import annotations

import pytest
import torch

import circle_fx
from circle_fx.emit.registry import lowering_for
from circle_fx.errors import UnsupportedOpError
from circle_fx.passes.decompositions import REFUSED_FORMS

from onert_eager import Fn, assert_onert_matches_eager, randn

aten = torch.ops.aten



class Unbind(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(randn(3, 4, seed=7))

    def forward(self, x):
        a, b, c = self.scale.unbind(0)
        return x * a + b * c


class HashTable(torch.nn.Module):
    """An int64 token -> expert table read with the ids (DeepSeek-V4's hash routing)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("tid2eid", torch.randint(0, 4, (16, 2), generator=torch.Generator().manual_seed(1)))

    def forward(self, ids):
        return self.tid2eid[ids]


CONTEXT = torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.int32)
QUERY = randn(8, seed=9)
class RowGather(torch.nn.Module):
    """RoBERTa: ``torch.gather(buffered_token_type_ids [1, max_len] int64, 1, position_ids)``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("row", torch.randint(0, 3, (1, 16), generator=torch.Generator().manual_seed(2)))

    def forward(self, ids):
        return torch.gather(self.row, 1, ids) * 2, torch.gather(self.row.float(), 1, ids)


def _ngram_einsum(q, k):
    """ProphetNet: an einsum (decomposed) of permuted, non-contiguous views."""
    q = q.view(2, 8, 2, 2, 4).permute(0, 2, 3, 1, 4)
    k = k.view(2, 8, 2, 2, 4).permute(0, 2, 3, 1, 4)
    return torch.einsum("bnhtc,bnhsc->bnhts", (q, k))


IDS = torch.tensor([[3, 0, 15, 7, 7, 2]])

CASES = {
    "unbind_weight": (Unbind(), [randn(2, 4)]),
    "softmax_axis_2_of_4d": (Fn(lambda x: x.softmax(dim=2) * 2), [randn(1, 3, 4, 5)]),
    "softmax_axis_1_dtype": (Fn(lambda x: torch.softmax(x, 1, dtype=torch.float32)), [randn(2, 6, 3)]),
    "log_softmax_axis_0": (Fn(lambda x: torch.log_softmax(x, 0)), [randn(5, 3)]),
    "sum_bool_int64": (Fn(lambda x: ((x > 0).sum(-1), (x > 0).sum(), (x < 0).sum(1, keepdim=True))), [randn(2, 6, 5)]),
    "int64_constant_table": (HashTable(), [IDS]),
    "gather_one_row_int64": (RowGather(), [IDS]),
    "sum_5d_middle_axis": (Fn(lambda x: x.sum(dim=2) + x.mean(dim=(2, 3)).unsqueeze(2)), [randn(1, 2, 3, 4, 5)]),
    "compare_5d_broadcast": (Fn(lambda i: (i.unsqueeze(-1) == torch.arange(3)).float().sum(-2)),
                             [torch.tensor([[[[0, 2], [1, 1]], [[2, 0], [0, 1]]]])]),
    "unfold_conv_windows": (Fn(lambda x: x.unfold(-1, 3, 1).flip(-1).transpose(1, 2) * 2), [randn(2, 4, 6)]),
    "unfold_step_2_middle_dim": (Fn(lambda x: x.unfold(1, 2, 2) + 1), [randn(2, 5, 3)]),
    "constant_lhs_matmul": (Fn(lambda x: torch.matmul(QUERY.view(-1, 8).expand(1, 2, 1, 8), x.transpose(-1, -2))),
                            [randn(1, 2, 3, 8)]),
    "int_and_or_of_flags": (Fn(lambda x: (CONTEXT | (x > 0)) & (x < 1)), [randn(2, 4)]),   # CPM-Ant's mask
    "cat_bools": (Fn(lambda x: torch.cat((torch.ones(2, 1, dtype=torch.bool), x > 0), dim=1)), [randn(2, 4)]),
    "slice_bools": (Fn(lambda x: (x > 0)[:, 1:3] & (x < 1)[:, ::2]), [randn(2, 4)]),
    "expand_bools": (Fn(lambda x: (x > 0).view(2, 1, 4).expand(2, 3, 4)), [randn(2, 4)]),
    "time_shift_crop_pad": (torch.nn.ZeroPad2d((0, 0, 1, -1)), [randn(1, 5, 4)]),          # RWKV
    "crop_both_ends": (Fn(lambda x: torch.nn.functional.pad(x, (-1, 2, -2, 0), value=3.0)), [randn(2, 5, 4)]),
    "einsum_of_permuted_views": (Fn(_ngram_einsum), [randn(2, 8, 16), randn(2, 8, 16, seed=1)]),
    "lt_5d_same_shape": (Fn(lambda x, y: x < y), [randn(1, 2, 3, 2, 2), randn(1, 2, 3, 2, 2, seed=1)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_form_matches_eager(name):
    module, inputs = CASES[name]
    assert_onert_matches_eager(module, inputs, rtol=1e-5, atol=1e-5)


def test_refused_forms_have_lowerings():
    """The cases exercise the refused-form route, not the plain no-lowering one."""
    for op in REFUSED_FORMS:
        assert lowering_for(op) is not None, op


def test_five_d_comparison_that_cannot_merge_is_refused():
    """Merging would need 5 axes: an error naming the op, not a silently wrong file."""
    a = torch.randint(0, 2, (2, 1, 2, 1, 2), generator=torch.Generator().manual_seed(0))
    b = torch.randint(0, 2, (1, 2, 1, 2, 1), generator=torch.Generator().manual_seed(1))
    with pytest.raises(UnsupportedOpError, match="5-D EQUAL"):
        circle_fx.export(Fn(lambda a, b: a == b), (a, b))
