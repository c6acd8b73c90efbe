"""``torch.where`` on integer and bool values.

onert 0.1.0's SELECT_V2 runs only float values (measured: int32, int64 and bool values fail at
run time with "Select: unsupported data type"), so the lowering selects integers as
``a * c + b * !c`` and bools as ``(c & a) | (!c & b)``. Gemma3n masks out-of-range token ids
with an int64 ``where``; ZAYA's router selects int64 expert indices.
"""
from __future__ import annotations

import pytest
import torch

from onert_eager import Fn, assert_onert_matches_eager

G = torch.Generator().manual_seed(0)
X = torch.randn(2, 3, 8, generator=G)


def _values(dtype):
    if dtype == torch.bool:
        return torch.rand(2, 3, 8, generator=G) > 0.5
    big = 10**10 if dtype == torch.int64 else 10**6  # int64 beyond int32 and float32 precision
    return torch.randint(-big, big, (2, 3, 8), generator=G, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_where_tensor_values(dtype):
    v = _values(dtype)
    cm = assert_onert_matches_eager(Fn(lambda x, a, b: torch.where(x > 0, a, b)), [X, v, v.flip(-1)], rtol=0, atol=0)
    assert "SELECT_V2" not in cm.op_histogram()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_where_broadcast_scalar_value(dtype):
    """Gemma3n's ``torch.where((ids >= 0) & (ids < vocab), ids, 0)``, the condition broadcast
    against a smaller value."""
    ids = torch.randint(-5, 300, (1, 8), generator=G, dtype=dtype)
    fn = Fn(lambda x, ids: torch.where((x[..., :1] > 0) & (ids < 256)[None, ..., None], ids[None, ..., None], 0))
    assert_onert_matches_eager(fn, [X[:1, :1].expand(1, 8, 8).contiguous(), ids], rtol=0, atol=0)
