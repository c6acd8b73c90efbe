"""Every RMSNorm the float fusion accepts reaches the integer RMS_NORM on the ``npu`` target.

One case per family of the RMSNorm fusion tests (``tests/fusions/test_rms_*.py``): each
spelling axis of ``rms_cases`` (square, reduction, inverse, eps order, weight position
including Gemma's ``(1 + w)`` and no weight, casts), a float16 weight, the transformers
norm classes, ``torch.nn.RMSNorm`` with and without weight, the re-added-dim and
``vector_norm`` forms, and a Hypothesis draw over all of them. Each is quantized with
``CircleQuantizer(quantize_elementwise=True)`` and exported with ``quant_target="npu"``:

- structure: one RMS_NORM whose input, gamma (a constant) and output are uint8 with
  quantization parameters, and no note in ``summary()``;
- numbers (single-norm models): the file's RMS_NORM evaluated in numpy from its own
  integers, gamma, epsilon and parameters reproduces the fake-quantized torch model within
  one output step.

A norm that cannot become an integer RMS_NORM is named in ``summary()``: HY-V4's scale after
a projection (``linear(x) * rsqrt(mean(x**2))``, the projection's quantized output sits
between the statistics and the scale), and any norm with the default scheme (RMSNorm
units are quantized only with ``quantize_elementwise=True``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circle_fx
from pt2e_util import np_dequantize, np_quantize, ops_named, quantize_pt2e, read
from rms_cases import CASTS, INVERSES, REDUCES, SQUARES, WEIGHTS, NormModule, Spelling, rms_epsilon, spellings

BASE = Spelling()
ONE_AXIS = ([BASE.but(square=v) for v in SQUARES] + [BASE.but(reduce=v) for v in REDUCES]
            + [BASE.but(inverse=v) for v in INVERSES] + [BASE.but(eps_first=True)]
            + [BASE.but(weight=v) for v in WEIGHTS] + [BASE.but(cast=v) for v in CASTS]
            + [BASE.but(weight="gemma", cast="llama"), BASE.but(weight="gemma", cast="gptoss"),
               BASE.but(weight="none", inverse="pow_m05")])


def _id(sp: Spelling) -> str:
    return ",".join(f"{k}={v}" for k, v in vars(sp).items() if getattr(BASE, k) != v) or "base"


def _npu(model, x, seed=1):
    g = torch.Generator().manual_seed(seed)
    calib = [(torch.randn(x.shape, generator=g) * 2,) for _ in range(3)] + [(x,)]
    c = quantize_pt2e(model, (x,), calib)
    return c, circle_fx.export(c, (x,), quant_target="npu")


def assert_integer_norms(cm, count=1):
    cf = read(cm)
    norms = ops_named(cf, "RMS_NORM")
    assert len(norms) == count, cm.summary()
    for norm in norms:
        ts = [cf.tensors[i] for i in (*norm.inputs, *norm.outputs)]
        assert [t.type_name for t in ts] == ["UINT8"] * 3, [t.type_name for t in ts]
        assert all(t.quantization is not None for t in ts)
        assert cf.tensor_data(norm.inputs[1]) is not None  # gamma is a quantized constant
    assert not [n for n in cm.report.notes if "npu" in n], cm.report.notes
    return cf


def assert_matches_numpy_reference(c, cm, x):
    """The file is QUANTIZE -> (RESHAPE) -> RMS_NORM -> (RESHAPE) -> DEQUANTIZE: evaluate its
    RMS_NORM in numpy (RESHAPE moves no value) and compare with the fake-quant torch model."""
    cf = read(cm)
    names = [op.name for op in cf.operators]
    assert [n for n in names if n != "RESHAPE"] == ["QUANTIZE", "RMS_NORM", "DEQUANTIZE"], names
    (q_op,), (norm,) = ops_named(cf, "QUANTIZE"), ops_named(cf, "RMS_NORM")
    x_qp = cf.tensors[q_op.outputs[0]].quantization
    g_t, y_t = cf.tensors[norm.inputs[1]], cf.tensors[norm.outputs[0]]
    xf = np_dequantize(np_quantize(x.numpy(), x_qp, np.uint8), x_qp)
    gamma = np_dequantize(cf.tensor_data(norm.inputs[1]), g_t.quantization)
    y = xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + np.float32(rms_epsilon(norm))) * gamma
    out = np_dequantize(np_quantize(y, y_t.quantization, np.uint8), y_t.quantization)
    steps = np.abs(out - c(x).detach().numpy()).max() / y_t.quantization.scale[0]
    assert steps <= 1.0 + 1e-3, steps


@pytest.mark.parametrize("sp", ONE_AXIS, ids=_id)
def test_each_spelling_is_an_integer_rms_norm(sp):
    model, x = NormModule(sp, 16), torch.randn(2, 5, 16) * 2
    c, cm = _npu(model, x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


@pytest.mark.parametrize("sp", [BASE, BASE.but(weight="gemma"), BASE.but(weight="inside", cast="t5")], ids=_id)
def test_heads_layout_between_linears(sp):
    """Qwen3/OLMo2 q-norm layout: linear -> view as heads -> norm -> transpose -> residual."""
    model, x = NormModule(sp, 32, pre="linear", post="residual", heads=4), torch.randn(2, 3, 32)
    assert_integer_norms(_npu(model, x)[1])


def test_float16_weight_is_quantized_as_gamma():
    model, x = NormModule(BASE, 16, wdtype=torch.float16), torch.randn(2, 5, 16)
    c, cm = _npu(model, x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


def _hf_norm(name):
    import transformers.models as m

    return {"llama": m.llama.modeling_llama.LlamaRMSNorm, "gemma": m.gemma.modeling_gemma.GemmaRMSNorm,
            "gemma3": m.gemma3.modeling_gemma3.Gemma3RMSNorm, "gpt_oss": m.gpt_oss.modeling_gpt_oss.GptOssRMSNorm,
            "olmo2": m.olmo2.modeling_olmo2.Olmo2RMSNorm, "qwen3": m.qwen3.modeling_qwen3.Qwen3RMSNorm,
            "t5": m.t5.modeling_t5.T5LayerNorm}[name]


@pytest.mark.parametrize("name", ["llama", "gemma", "gemma3", "gpt_oss", "olmo2", "qwen3", "t5"])
def test_transformers_norm_modules(name):
    norm = _hf_norm(name)(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16) * 0.2 + (0.0 if name.startswith("gemma") else 1.0))
    x = torch.randn(2, 5, 16) * 2
    c, cm = _npu(norm, x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


@pytest.mark.parametrize("affine", [True, False])
def test_nn_rmsnorm(affine):
    norm = torch.nn.RMSNorm(16, eps=1e-5, elementwise_affine=affine)
    if affine:
        norm.weight = torch.nn.Parameter(torch.rand(16) + 0.5)
    x = torch.randn(2, 5, 16)
    c, cm = _npu(norm, x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


W = torch.linspace(0.5, 1.5, 16)
FORMS = {
    "mean_index_none": lambda x: x * torch.rsqrt(x.pow(2).mean(-1)[..., None] + 1e-6) * W,
    "mean_view": lambda x: x * torch.rsqrt(x.pow(2).mean(-1).view(*x.shape[:-1], 1) + 1e-6) * W,
    "vector_norm_times_rsqrt_d": lambda x: x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) * 16 ** -0.5) * W,
    "vector_norm_squared_over_d": lambda x: x * torch.rsqrt(
        torch.linalg.vector_norm(x, dim=-1, keepdim=True).pow(2) / 16 + 1e-6) * W,
}


@pytest.mark.parametrize("name", list(FORMS))
def test_re_added_dim_and_vector_norm_forms(name):
    from onert_eager import Fn

    x = torch.randn(1, 16, 16)
    c, cm = _npu(Fn(FORMS[name]), x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sp=spellings, d=st.integers(2, 24), lead=st.lists(st.integers(1, 3), min_size=1, max_size=2))
def test_any_accepted_spelling_is_an_integer_rms_norm(sp, d, lead):
    model, x = NormModule(sp, d), torch.randn(*lead, d, generator=torch.Generator().manual_seed(d)) * 2
    c, cm = _npu(model, x)
    assert_integer_norms(cm)
    assert_matches_numpy_reference(c, cm, x)


# ------------------------------------------------------------ what cannot, and says so

class _ScaleAfterProjection(torch.nn.Module):
    """HY-V4: ``linear(x, W) * rsqrt(mean(x**2) + eps)`` (test_rms_before_projection.py)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 16) / 4)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_scale_after_projection_is_reported():
    _, cm = _npu(_ScaleAfterProjection(), torch.randn(2, 5, 16))
    assert "RMS_NORM" not in cm.op_histogram()
    (note,) = [n for n in cm.report.notes if "npu" in n]
    assert "mean(s) of squares not fused" in note and "test_pt2e_npu_norms.py" in note, note
    assert note in cm.summary()


def test_default_scheme_leaves_norms_float_and_says_so():
    from circle_fx.quant import CircleQuantizer

    model, x = NormModule(BASE, 16, pre="linear", post="silu"), torch.randn(2, 5, 16)
    c = quantize_pt2e(model, (x,), [(x,)], CircleQuantizer())
    cm = circle_fx.export(c, (x,), quant_target="npu")
    (note,) = [n for n in cm.report.notes if "npu" in n]
    assert "1 RMSNorm(s) stay float32" in note and "quantize_elementwise=True" in note, note
    assert note in cm.summary()


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


@pytest.mark.slow
def test_tiny_gemma3_norms_are_integer_on_npu():
    """Gemma 3 (``(1 + w)`` gamma, q/k norms, sandwich norms): all 13 RMS_NORMs are uint8 on
    the npu target, nothing is noted, and the file differs from the onert one (~25 s)."""
    from families import BY_NAME, SEQ_LEN, VOCAB

    model = _Logits(BY_NAME["gemma3_text"].build())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=g)
    c = quantize_pt2e(model, (ids,), [(torch.randint(0, VOCAB, ids.shape, generator=g),) for _ in range(2)])
    cm = circle_fx.export(c, (ids,), quant_target="npu")
    assert_integer_norms(cm, count=13)
    onert = circle_fx.export(c, (ids,), quant_target="onert")
    cf = read(onert)
    assert {cf.tensors[op.inputs[0]].type_name for op in ops_named(cf, "RMS_NORM")} == {"FLOAT32"}
