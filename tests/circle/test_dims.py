"""The dims algebra every fold, broadcast and reshape computation shares (circle_fx.circle.dims)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from circle_fx.circle.dims import DYNAMIC, around, broadcast, fmt, fold, numel, padded, runs

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=6)


@given(st.lists(shapes, min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_broadcast_agrees_with_numpy(shs):
    try:
        want = list(np.broadcast_shapes(*map(tuple, shs)))
    except ValueError:
        with pytest.raises(ValueError, match="do not broadcast"):
            broadcast(*shs)
        return
    assert broadcast(*shs) == want


def test_broadcast_dynamic():
    assert broadcast([DYNAMIC, 1, 3], [5, 1]) == [DYNAMIC, 5, 3]
    assert broadcast([DYNAMIC, 4], [7, 1]) == [7, 4]  # a static size other than 1 wins
    assert fmt([2, DYNAMIC]) == "[2, ?]"


@given(shapes, st.data())
@settings(max_examples=200, deadline=None)
def test_runs_fold_keeps_order_and_elements(shape, data):
    keys = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    groups = runs(keys, skip=lambda k: shape[k] == 1)
    assert all(keys[k] == key for key, ks in groups for k in ks)
    assert all(a[0] != b[0] for a, b in zip(groups, groups[1:]))  # neighbours differ
    flat = [k for _, ks in groups for k in ks]
    assert flat == sorted(flat) and set(flat) == {k for k, s in enumerate(shape) if s != 1}
    assert math.prod(fold(shape, groups)) == math.prod(shape)


def test_numel_around_padded():
    assert numel([2, DYNAMIC, 3]) == DYNAMIC and numel([]) == 1
    assert around([2, 3, 4, 5], 2) == [6, 4, 5]
    assert around([2, DYNAMIC, 4], 2) == [DYNAMIC, 4, 1]
    assert padded([3], 3) == [1, 1, 3]
