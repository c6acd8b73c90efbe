"""Any prompt length from ``input_ids`` alone .

A transformers causal LM exported ONCE with a dynamic sequence dim and only ``input_ids``
computes its position ids and causal (and sliding-window) mask from the length at run
time: ``arange``, ``diff``, ``cumsum``, index functions over them. onert 0.1.0 has no
RANGE/CUMSUM, so circle_fx builds them as prefix sums of ones taken from ``input_ids``
(emit/lowerings/scan.py). One Circle model then runs at every length up to the dim's max
and matches eager; past the max ``CircleModel.run`` refuses (the prefix sum is unrolled
for max elements), and a dim without a max is a clear export error.

Tolerance: logits within 1e-5 absolute of eager (measured: at most 4e-7).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import circle_fx
from circle_fx import InputError, UnsupportedOpError

from families import BY_NAME, VOCAB, is_rms_norm_module

ATOL = 1e-5
MAX = 64


def export_dynamic(model, max_len=MAX):
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    return circle_fx.export(model, (ids,), example_kwargs={"use_cache": False},
                            dynamic_shapes={"input_ids": {1: Dim("seq", max=max_len)}, "use_cache": None})


def check_lengths(cm, model, lengths):
    gen = torch.Generator().manual_seed(1)
    for n in lengths:
        x = torch.randint(0, VOCAB, (1, n), generator=gen)
        (got,) = cm.run(x)
        with torch.no_grad():
            want = model(input_ids=x, use_cache=False).logits.numpy()
        assert got.shape == want.shape == (1, n, VOCAB)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"length {n}")


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text", "mistral"])
def test_one_model_for_every_prompt_length(family):
    """Exported once, run at 1, 7 and 33 tokens (Gemma3 and Mistral with a sliding window of
    4, so the windowed mask is exercised too)."""
    model = BY_NAME[family].build()
    cm = export_dynamic(model)
    hist = cm.op_histogram()
    for op in ("RANGE", "CUMSUM", "GATHER_ND", "FILL"):
        assert hist[op] == 0, op
    # every RMSNorm was still recognised; on a dynamic length it is emitted decomposed
    # (onert's RMS_NORM cannot resize), one MEAN each
    norms = sum(1 for m in model.modules() if is_rms_norm_module(m))
    assert len(cm.report.fusions) == norms
    assert hist["RMS_NORM"] == 0 and hist["MEAN"] == norms
    check_lengths(cm, model, [1, 7, 33])


def test_a_batch_of_prompts():
    """Batch 2 (static) with a dynamic length: transformers expands the positions to
    [B, S] and indexes them with [batch_idx, kv_idx]; the batch index selects among equal
    rows, so it is dropped (no GATHER_ND), and the int64 expand is an ADD of zeros (onert's
    TILE is float-only)."""
    model = BY_NAME["llama"].build()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False},
                          dynamic_shapes={"input_ids": {1: Dim("seq", max=MAX)}, "use_cache": None})
    for n in (1, 7, 33):
        x = torch.randint(0, VOCAB, (2, n), generator=gen)
        (got,) = cm.run(x)
        with torch.no_grad():
            want = model(input_ids=x, use_cache=False).logits.numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"length {n}")


def test_length_above_the_max_is_refused():
    model = BY_NAME["llama"].build()
    cm = export_dynamic(model, max_len=40)
    check_lengths(cm, model, [40])  # the max itself works
    with pytest.raises(InputError, match=r"'input_ids' has size 41 in dim 1; .* at most 40"):
        cm.run(torch.zeros(1, 41, dtype=torch.long))
    assert "input_ids dim 1 <= 40" in cm.summary()


def test_dynamic_dim_without_max_is_a_clear_error():
    model = BY_NAME["llama"].build()
    ids = torch.randint(0, VOCAB, (1, 8))
    with pytest.raises(UnsupportedOpError) as info:
        circle_fx.export(model, (ids,), example_kwargs={"use_cache": False},
                         dynamic_shapes={"input_ids": {1: Dim("seq")}, "use_cache": None})
    msg = str(info.value)
    assert "aten.arange" in msg and "modeling_llama.py" in msg
    assert "dim 1 of input 'input_ids'" in msg and "no upper bound" in msg and "max=" in msg


# ------------------------------------------------------------- the ops on their own
class Scans(nn.Module):
    """cumsum (float and int, the int one of a bool like transformers' packed-sequence
    check), diff with prepend, arange over the length from a start."""

    def forward(self, x, ids):
        pos = torch.arange(3, ids.shape[1] + 3)
        new_seq = (torch.diff(ids, dim=-1, prepend=ids[:, :1] - 1) != 1).cumsum(-1)
        return x.cumsum(1), ids.cumsum(-1), pos * 2, new_seq, torch.diff(x, dim=1)


def test_scan_ops_on_a_dynamic_dim():
    seq = Dim("seq", min=3, max=50)  # diff without prepend: torch guards seq - 1 != 1
    model = Scans()
    cm = circle_fx.export(model, (torch.randn(2, 5, 3), torch.randint(0, 9, (1, 5))),
                          dynamic_shapes=({1: seq}, {1: seq}))
    gen = torch.Generator().manual_seed(0)
    for n in (3, 9, 50):
        x, ids = torch.randn(2, n, 3, generator=gen), torch.randint(0, 9, (1, n), generator=gen)
        ids[0, n // 2:] = torch.arange(n - n // 2)  # a run of consecutive ids
        want = model(x, ids)
        got = cm.run(x, ids)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


class CumsumTwoDynamicDims(nn.Module):
    def forward(self, x):
        return x.cumsum(1)


def test_float_cumsum_with_two_dynamic_dims_uses_pad():
    cm = circle_fx.export(CumsumTwoDynamicDims(), (torch.randn(3, 5),),
                          dynamic_shapes=({0: Dim("b", max=8), 1: Dim("s", max=20)},))
    assert cm.op_histogram()["PAD"] == 5  # ceil(log2(20)) doublings
    for b, s in ((1, 1), (4, 13), (8, 20)):
        x = torch.randn(b, s)
        (got,) = cm.run(x)
        np.testing.assert_allclose(got, x.cumsum(1).numpy(), rtol=1e-5, atol=1e-5)


class StaticCumsums(nn.Module):
    def forward(self, x, ids):
        return x.cumsum(-1), x.cumsum(0), (ids > 3).cumsum(1), ids.cumsum(1)


def test_cumsum_on_static_shapes():
    """The same prefix sum lowers cumsum on static dims (there the size is its own bound)."""
    model = StaticCumsums()
    x, ids = torch.randn(3, 4, 37), torch.randint(0, 9, (2, 11))
    cm = circle_fx.export(model, (x, ids))
    assert cm.op_histogram()["CUMSUM"] == 0
    for g, w in zip(cm.run(x, ids), model(x, ids)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
