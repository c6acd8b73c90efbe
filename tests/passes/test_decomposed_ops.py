"""Ops real transformers families need that have no lowering of their own: each must be
decomposed (``passes/decompose_unlowered.py``: circle_fx's table, then torch's core ATen
table) or rewritten (``passes/complex_to_real.py``) into ops that lower, then run in onert
and match eager. One tiny module per op, written the way the family writes it.

Tolerance: rtol=atol=1e-5 (float32; decompositions reassociate sums, e.g. ``var_mean`` and
``conv1d`` as CONV_2D, and ``expm1`` is ``exp(x) - 1``).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import circle_fx
from circle_fx.emit.registry import lowering_for
from circle_fx.errors import UnsupportedOpError

from onert_eager import Fn, assert_onert_matches_eager, randn

aten = torch.ops.aten



W = randn(4, 4, 3, seed=3)          # conv1d weight [C_out, C_in, K]
DW = randn(8, 1, 3, seed=4)         # depthwise conv1d weight [C, 1, K]
GW = randn(12, 2, 2, seed=6)        # grouped conv1d weight [C_out, C_in / groups, K] (6 groups)
SCALE = randn(3, 4, seed=7)        # a constant unbound into three rows
FREQS = torch.polar(torch.ones(6, 4), randn(6, 4, seed=5))   # complex rotary table [S, D/2]


def _interleaved_rope(x):
    """GLM / Cohere: rotate pairs (x0, x1) -> (-x1, x0) with stack + flatten."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return x * 0.5 + torch.stack((-x2, x1), dim=-1).flatten(-2) * 0.25


def _complex_rope(x):
    """Llama4: view pairs as complex numbers, multiply by freqs_cis, view back as real."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * FREQS[None, :, None, :]).flatten(3)


def _polar_rope(x, angle):
    """Llama4's decode step: ``freqs_cis = polar(ones, angle)`` of a run-time angle (the position)."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angle), angle)[None, :, None, :]).flatten(3)


def _mla_like(x):
    """DeepSeek MLA: new_empty + slice copies (copy_ / slice_scatter) assemble q."""
    q = x.new_empty(x.shape[0], x.shape[1], 12)
    q[..., :8] = x[..., :8] * 2
    q[..., 8:] = x[..., 4:8] + 1
    return q


def _xielu(x):
    """Apertus' xIELU: min.other, expm1."""
    alpha_p, alpha_n, beta, eps = 0.8, 0.8, 0.5, -1e-6
    return torch.where(x > 0, alpha_p * x * x + beta * x,
                       (torch.expm1(torch.min(x, torch.tensor(eps))) - x) * alpha_n + beta * x)


def _router_scatter(x):
    """Llama4 router: full_like(-inf).scatter_(1, topk indices, topk values), then sigmoid."""
    v, i = torch.topk(x, 2, dim=1)
    return torch.sigmoid(torch.full_like(x, float("-inf")).scatter_(1, i, v))


def _unbind_weight(x):
    """DeepSeek-V4: ``self.scale.unbind(0)`` on a constant: folded per result."""
    a, b, c = SCALE.unbind(0)
    return x * a + b * c


def _ngram_einsum(q, k):
    """ProphetNet: an einsum of permuted, non-contiguous views (the decomposition is traced on
    examples strided like the graph's values)."""
    q = q.view(2, 8, 2, 2, 4).permute(0, 2, 3, 1, 4)
    k = k.view(2, 8, 2, 2, 4).permute(0, 2, 3, 1, 4)
    return torch.einsum("bnhtc,bnhsc->bnhts", (q, k))


VEC = randn(8, seed=8)


def _masked_rows(x):
    """T5Gemma 2: ``embeds[ids == eoi] = eoi_embedding`` (one vector broadcast over the rows)."""
    y = x.clone()
    y[x[..., 0] > 0] = VEC
    return y


def _masked_ids(x):
    """Granite Speech: ``ids[is_audio] = 0`` on int64 ids (``where`` with integer values)."""
    ids = (x * 10).long()
    ids[ids > 3] = 0
    return ids


def _masked_columns_accumulate(x):
    """``y[:, mask] += v``: the mask after a full slice, ``accumulate``."""
    y = x.clone()
    y[:, x[0, :, 0] > 0] += VEC
    return y


W8 = randn(6, 8, seed=9)


def _adapter_per_row(x):
    """X-MOD's per-language adapters: ``out[mask] = adapter(x[mask])``, one value row per
    selected row (a run-time count): the adapter on every row, then a select (masked_rows)."""
    m = x[:, 0, 0] > 0
    out = torch.zeros_like(x)
    out[m] = F.linear(F.gelu(F.linear(x[m], W8)), W8.T) * 2
    return out


def _softmax_rows_2d_mask(x):
    """A 2-D mask (rows of a batch of sequences) and a softmax inside each row."""
    y = x.clone()
    m = x[..., 0] > 0
    y[m] = torch.softmax(x[m] * 3, dim=1)
    return y


def _distinct_index(shape, dim, k, seed=7):
    """A constant index, distinct along ``dim`` (a scatter source needs no duplicates)."""
    return randn(*shape, seed=seed).argsort(dim=dim).narrow(dim, 0, k).contiguous()


IDX_DIM1 = _distinct_index((2, 5, 4, 3), 1, 2)   # gathers from [2, 5, 6, 3]: smaller outside dim 1 too
IDX_DIM2 = _distinct_index((1, 2, 5, 3), 2, 2)
IDX_T = _distinct_index((2, 3, 5, 4), 1, 2)      # used transposed: a non-contiguous index


CASES = {
    "stack_flatten_rope": (_interleaved_rope, [(2, 6, 4, 8)]),
    "view_as_complex_rope": (_complex_rope, [(1, 6, 2, 8)]),
    "polar_of_an_input_rope": (_polar_rope, [(1, 6, 2, 8), (6, 4)]),
    "conv1d_depthwise_causal": (lambda x: F.conv1d(x, DW, padding=2, groups=8)[..., :6], [(1, 8, 6)]),
    "conv1d_dense_bias": (lambda x: F.conv1d(x, W, bias=torch.ones(4), padding=1), [(2, 4, 7)]),
    "conv1d_grouped_per_head": (lambda x: F.conv1d(x, GW, groups=6), [(1, 12, 7)]),           # ZAYA's q/k conv
    "conv1d_grouped_strided": (lambda x: F.conv1d(x, GW, bias=torch.ones(12), stride=2, padding=1, groups=6),
                               [(2, 12, 7)]),
    "mla_new_empty_copy": (_mla_like, [(2, 5, 8)]),
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y * 3, dim=1, start=1, end=3), [(2, 4, 3), (2, 2, 3)]),
    "xielu_min_expm1": (_xielu, [(3, 16)]),
    "multiply_alias": (lambda x, y: torch.multiply(x, y) + torch.subtract(x, y), [(3, 5), (3, 5)]),
    "repeat": (lambda x: x.repeat(2, 1, 3) * 2, [(2, 3, 4)]),
    "repeat_4d_diffllama": (lambda x: x.repeat(1, 2, 1, 1) * 2, [(1, 2, 8, 16)]),  # was a rank-8 TRANSPOSE
    "repeat_new_leading_dims": (lambda x: x.repeat(2, 1, 1, 2) * 2, [(2, 3, 4)]),
    "full_like_zeros_like": (lambda x: x * torch.full_like(x, 3.0) + torch.zeros_like(x) + torch.ones_like(x), [(2, 5)]),
    "scatter_topk_router": (_router_scatter, [(6, 5)]),
    "scatter_value_bool_mask": (lambda x: torch.ones(x.shape, dtype=torch.bool).scatter(
        -1, torch.topk(x, 2, dim=-1).indices, False).float() * x, [(1, 4, 6)]),    # DeepSeek-V3.2 indexer
    "scatter_value_duplicates": (lambda x: torch.zeros_like(x).scatter_(1, torch.tensor([[0, 0], [2, 2]]), 1.0) + x,
                                 [(2, 3)]),
    "masked_fill": (lambda x: x.masked_fill(x > 0.3, -1.5), [(4, 6)]),
    "gather": (lambda x: torch.gather(x, 1, torch.topk(x, 3, dim=1).indices) * 2, [(4, 7)]),
    # 4-D (Inkling's relative logits): the one-hot would be 5-D and onert 0.1.0's SUM refuses 5-D
    "gather_4d": (lambda x: torch.gather(x, -1, torch.topk(x, 2, dim=-1).indices) * 2, [(1, 3, 5, 6)]),
    "gather_4d_middle_dim_smaller_index": (lambda x: torch.gather(x, 1, IDX_DIM1), [(2, 5, 6, 3)]),
    "gather_4d_transposed_index": (lambda x: torch.gather(x, 1, IDX_T.transpose(2, 3)) * 2, [(2, 3, 4, 5)]),
    "scatter_4d": (lambda x: torch.zeros_like(x).scatter(2, IDX_DIM2, x * 3), [(1, 2, 5, 3)]),
    "tril_triu": (lambda x: torch.tril(x) - torch.triu(x, 1), [(5, 5)]),
    "pad_constant": (lambda x: F.pad(x, (2, 1, 0, 1)) + 1, [(2, 3, 4)]),
    "pad_value": (lambda x: F.pad(x, (1, 1), value=-2.0), [(2, 3)]),
    "softplus": (lambda x: F.softplus(x * 3), [(4, 8)]),
    "einsum": (lambda x, y: torch.einsum("bhsd,bhtd->bhst", x, y), [(1, 2, 3, 4), (1, 2, 5, 4)]),
    # Mamba-2's chunked scan: states are a slice of a permuted tensor, so the decomposition must
    # be traced with the graph's strides (a view of contiguous examples would be wrong)
    "einsum_of_a_permuted_slice": (lambda c, s: torch.einsum("bclhn,bchpn->bclhp", c, s.permute(1, 2, 0, 3, 4)[:, :-1]),
                                   [(1, 2, 4, 8, 8), (8, 1, 3, 16, 8)]),
    "linalg_vector_norm": (lambda x: x / torch.linalg.vector_norm(x, dim=-1, keepdim=True), [(3, 8)]),
    "var_mean": (lambda x: tuple(torch.var_mean(x, dim=-1, keepdim=True)), [(3, 8)]),
    "layer_norm": (lambda x: F.layer_norm(x, (8,), torch.linspace(0.5, 1.5, 8), torch.linspace(-1, 1, 8)), [(2, 3, 8)]),
    "flip": (lambda x: torch.flip(x, dims=[-1]) * 2, [(3, 6)]),
    "unbind_constant": (_unbind_weight, [(2, 4)]),
    "unfold_conv_windows": (lambda x: x.unfold(-1, 3, 1).flip(-1).transpose(1, 2) * 2, [(2, 4, 6)]),  # Inkling2
    "unfold_step_2_middle_dim": (lambda x: x.unfold(1, 2, 2) + 1, [(2, 5, 3)]),
    "einsum_of_permuted_views": (_ngram_einsum, [(2, 8, 16), (2, 8, 16)]),
    "erf_gelu_esm": (lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))), [(4, 16)]),   # ESM, SEW-D
    "acos_yoso": (lambda x: 1 - torch.acos(torch.tanh(x)) / math.pi, [(4, 16)]),               # YOSO's LSH weight
    "asin": (lambda x: torch.asin(torch.tanh(x)), [(4, 16)]),
    "index_put_mask_vector": (_masked_rows, [(2, 5, 8)]),
    "index_put_mask_int64_scalar": (_masked_ids, [(2, 6)]),
    "index_put_mask_after_slice_accumulate": (_masked_columns_accumulate, [(2, 5, 8)]),
    "index_put_rows_of_a_runtime_count_xmod": (_adapter_per_row, [(3, 5, 8)]),
    "index_put_rows_2d_mask_softmax": (_softmax_rows_2d_mask, [(2, 5, 8)]),
    "amin": (lambda x: torch.amin(x, dim=1) + torch.amin(x, dim=(0, 2), keepdim=True).sum(), [(2, 5, 3)]),
    "linear_vector_weight_dfine": (lambda x: F.linear(torch.softmax(x, -1), VEC), [(2, 5, 8)]),  # drops the last dim
    # FNet's token mixing: DFTs as cosine / sine matrix products (complex_to_real)
    "fftn_real_fnet": (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, [(2, 8, 12)]),
    "fft_ortho_view_as_real": (lambda x: torch.view_as_real(torch.fft.fft(x, norm="ortho")), [(2, 3, 10)]),
    "fft2_forward_imag": (lambda x: torch.fft.fft2(x * 2 + 1, norm="forward").imag, [(3, 6, 5)]),
    "fft_of_integers": (lambda x: torch.fft.fft((x * 10).long()).real, [(2, 6)]),   # transformed as float
    "fft_of_a_complex_result": (lambda x: torch.view_as_real(torch.fft.fft(torch.fft.fft(x, dim=1), dim=2)),
                                [(2, 8, 12)]),
    # MobileViTV2: fold of non-overlapping patches (kernel = stride) is a permutation of values
    "col2im_patches": (lambda x: F.fold(x * 2, (6, 4), 2, stride=2), [(2, 12, 6)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_decomposes_and_matches_eager(name):
    fn, shapes = CASES[name]
    inputs = [randn(*s, seed=i) for i, s in enumerate(shapes)]
    assert_onert_matches_eager(Fn(fn), inputs, rtol=1e-5, atol=1e-5)


def _shift_tokens_right(ids):
    """BART's ``shift_tokens_right`` (its masked-LM head builds decoder ids this way): int64
    slice copies, which must not become an int64 GATHER (onert 0.1.0 has none)."""
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 2
    return shifted.masked_fill(shifted == -100, 1)


@pytest.mark.parametrize("fn", [
    _shift_tokens_right,
    lambda ids: torch.slice_scatter(ids, ids[:, :3] * 2, dim=1, start=-5, end=-2),
    # step 2: torch's decomposition (a GATHER; float, since onert has no int64 GATHER)
    lambda ids: torch.slice_scatter(ids.float(), ids[:, 1::2] + 1.5, dim=1, start=0, step=2),
], ids=["bart_shift_tokens_right", "negative_bounds", "step_2"])
def test_int64_slice_scatter_runs_in_onert(fn):
    ids = torch.randint(3, 1000, (2, 8), generator=torch.Generator().manual_seed(0))
    cm = assert_onert_matches_eager(Fn(fn), (ids,), rtol=0, atol=0)
    if fn is _shift_tokens_right:
        assert "GATHER" not in cm.op_histogram(), cm.op_histogram()


def _dense(lo, hi, n=200001):
    return torch.linspace(lo, hi, n)


@pytest.mark.parametrize("op, ref, lo, hi, bound", [
    (torch.erf, math.erf, -6.0, 6.0, 4e-7),
    (torch.acos, math.acos, -1.0, 1.0, 6e-7),
    (torch.asin, math.asin, -1.0, 1.0, 6e-7),
])
def test_polynomial_forms_error_in_onert(op, ref, lo, hi, bound):
    """erf / acos / asin have no Circle operator (ATAN2 neither, in onert 0.1.0): their
    decompositions are polynomials; over a dense grid, run in onert, the absolute error
    against float64 stays within ``bound`` (measured 3.1e-7 for erf, 4.3e-7 for acos; erf's
    relative error near 0 within 1e-6, where a single A&S formula would be 24 % off)."""
    import numpy as np
    x = _dense(lo, hi)
    cm = circle_fx.export(Fn(lambda v: op(v)), (x,))
    got = cm.run(x)[0].astype(np.float64)
    want = np.array([ref(v) for v in x.double().tolist()])
    err = np.abs(got - want)
    assert err.max() < bound, (float(err.max()), float(x[err.argmax()]))
    if op in (torch.erf, torch.asin):  # odd functions: near 0 their series keeps the relative error
        small = (np.abs(want) > 0) & (np.abs(x.numpy()) < 0.5)
        assert (err[small] / np.abs(want[small])).max() < 1e-6


def test_decomposed_ops_had_no_lowering():
    """The cases above exercise the fallback, not lowerings added meanwhile (else this file
    would silently stop testing the mechanism)."""
    for op in (aten.stack.default, aten.gather.default, aten.scatter.src, aten.expm1.default, aten.var_mean.correction,
               aten.convolution.default, aten.view_as_complex.default, aten.slice_scatter.default,
               aten.erf.default, aten.acos.default, aten.asin.default, aten.col2im.default,
               aten.index_put.default, aten.fft_fftn.default, aten.fft_fft.default, aten.real.default,
               aten.amin.default):
        assert lowering_for(op) is None, op


def test_op_without_a_lowering_or_decomposition_names_the_original_op():
    """An op with no lowering and no decomposition that lowers (sort) is reported as itself,
    not as a piece of some decomposition."""
    with pytest.raises(UnsupportedOpError, match="sort") as e:
        circle_fx.export(Fn(lambda x: torch.sort(x, dim=-1).values * 2), (randn(3, 4),))
    assert [op for op, _, _ in e.value.ops] == ["aten.sort.default"]


def _centred_rows(x):
    """``out[mask] = x[mask] - x[mask].mean(0)``: each value depends on every selected row."""
    m = x[:, 0, 0] > 0
    out = torch.zeros_like(x)
    out[m] = x[m] - x[m].mean(0)
    return out


@pytest.mark.parametrize("fn, op", [
    (_centred_rows, "boolean-mask indexing"),
    (lambda x: torch.fft.fft(x, n=16).real, "fft_fft"),   # a size: padding first, not written
], ids=["index_put_rows_mixed_across_rows", "fft_with_a_size"])
def test_unwritten_forms_name_the_op(fn, op):
    """Forms the rewrites do not take stay whole, and the error names the user's op."""
    with pytest.raises(UnsupportedOpError, match=op):
        circle_fx.export(Fn(fn), (randn(3, 4, 8),))


def test_layer_norm_export_is_one_pass_of_ops_with_no_gelu_or_norm_op():
    """Sanity of the mechanism on a composite: layer_norm lowers through var_mean's
    decomposition to elementwise ops and two reductions."""
    cm = circle_fx.export(Fn(lambda x: F.layer_norm(x, (8,))), (randn(2, 8),))
    hist = cm.op_histogram()
    assert hist["MEAN"] + hist["SUM"] + hist["RMS_NORM"] >= 1 and math.isfinite(sum(hist.values()))
