"""Regressions for lowering bugs found in review, each checked in onert against eager.

- ``max.dim``/``min.dim`` on 4-D inputs skipped the keep-dims workaround onert needs;
- negative indices: GATHER reads out of bounds where torch counts from the end, both for
  constant index tensors (wrapped at compile time) and run-time ones (wrapped with
  ``idx + size * (idx < 0)``);
- integer sums: onert has no int64 SUM, so it must be a clear error, not a wrong answer;
- ``clamp`` with a dynamic batch;
- transposes of non-float tensors: onert 0.1.0's TRANSPOSE runs only float32 and int32
  (XLNet's ``input_ids.transpose(0, 1)`` failed at run time).
"""
from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import circle_fx
from onert_eager import Fn, assert_onert_matches_eager

TOL = dict(rtol=1e-6, atol=1e-6)


X4 = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
X2 = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fn", [
    lambda x: x.max(dim=1).values + 0,
    lambda x: x.min(dim=2)[0] * 1,
    lambda x: x.max(dim=1).indices,
    lambda x: x.min(dim=-2, keepdim=True)[0] * 2,
], ids=["max_values", "min_values", "max_indices", "min_keepdim"])
def test_max_min_dim_on_4d(fn):
    assert_onert_matches_eager(Fn(fn), (X4,), **TOL)


@pytest.mark.parametrize("index", [[-1, 0, -3], [2, -7, 6]], ids=["rows", "cols"])
def test_negative_constant_indices(index):
    idx = torch.tensor(index)
    fn = (lambda x: x[idx] * 1) if max(abs(i) for i in index) <= 3 else (lambda x: x[:, idx] * 1)
    assert_onert_matches_eager(Fn(fn), (X2,), **TOL)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_negative_runtime_indices(dtype):
    idx = torch.tensor([-1, 0, -7, 6], dtype=dtype)
    cm = assert_onert_matches_eager(Fn(lambda x, i: x[:, i]), (X2, idx), **TOL)
    # the same model with other (non-negative, then negative) indices at run time
    for other in ([0, 1, 2, 3], [-2, -3, -4, -5]):
        i = torch.tensor(other, dtype=dtype)
        assert torch.equal(torch.as_tensor(cm.run(X2, i)[0]), X2[:, i])


def test_int64_sum_is_a_clear_error():
    """A sum of int64 values (not provably within int32) stays a clear error; a sum of bools
    is now exact as an int32 SUM (tests/lowerings/test_family_op_forms.py::...[sum_bool_int64])."""
    with pytest.raises(circle_fx.UnsupportedOpError, match="int32"):
        circle_fx.export(Fn(lambda x: (x * 1000).long().sum(dim=-1)), (X2,))


class _Clamp(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=-0.5, max=0.5) * 2


def test_clamp_with_dynamic_batch():
    model = _Clamp()
    cm = circle_fx.export(model, (X2,), dynamic_shapes=({0: Dim("b", min=2, max=8)},))
    for rows in (3, 6):
        x = torch.randn(rows, 7, generator=torch.Generator().manual_seed(rows))
        assert torch.allclose(torch.as_tensor(cm.run(x)[0]), model(x), **TOL)


IDS = torch.randint(0, 2**40, (1, 8), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("fn, inp", [
    (lambda ids: ids.transpose(0, 1) * 3, IDS),                      # XLNet: only a size-1 dim moves
    (lambda x: (x > 0).permute(2, 0, 3, 1), X4),                        # bool: through int32
    (lambda x: (x > 0).transpose(0, 1).float() * x.transpose(0, 1), X2),
], ids=["int64_size1_dims", "bool_permute", "bool_transpose"])
def test_transpose_of_types_onert_cannot_transpose(fn, inp):
    assert_onert_matches_eager(Fn(fn), (inp,), **TOL)


def test_int64_transpose_is_a_clear_error():
    with pytest.raises(circle_fx.UnsupportedOpError, match="TRANSPOSE runs only float32 and int32"):
        circle_fx.export(Fn(lambda ids: ids.transpose(0, 1) * 2), (IDS.reshape(2, 4),))


A5 = torch.randn(1, 3, 5, 2, 6, generator=torch.Generator().manual_seed(3))
B5 = torch.randn(1, 3, 5, 2, 6, generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b: (a < b).float() + (a >= b).float() * 2, (A5, B5)),         # same shape
    (lambda a, b: (a > b[:, :1, :, :, :1]).float(), (A5, B5)),               # broadcast in two places
    (lambda a, b: torch.where(a != b[..., :1, :], a, b), (A5, B5)),
], ids=["lt_ge_same_shape", "gt_broadcast", "ne_where"])
def test_5d_comparisons(fn, inputs):
    """onert 0.1.0's 5-D LESS / GREATER / NOT_EQUAL ... return wrong booleans with no error;
    emit/legalize/ranks.py merges dims to rank <= 4 after lowering (circle/limits.py: COMPARISON)."""
    assert_onert_matches_eager(Fn(fn), inputs, **TOL)
