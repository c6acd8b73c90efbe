"""Every RMSNorm spelling circle_fx claims fuses to exactly one ``circle::rms_norm``
and keeps the numerics of eager PyTorch.

FX-level checks (``program.run`` of the fused graph vs the eager module) run in float32,
float16 and bfloat16: tolerance 1e-5 for float32 and ``4 * finfo(dtype).eps`` (relative and
absolute) for the half types, because the fused op accumulates in float32 whereas a
half-precision eager spelling rounds after each step. onert checks run in float32 only.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from rms_cases import (CASTS, INVERSES, REDUCES, SQUARES, WEIGHTS, NormModule, Spelling, assert_matches_eager,
                       fused_program, rms_nodes)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: (layout name, input shape, heads): heads > 0 views [.., H*D] as [.., H, D] and
#: normalises the head dimension of the 4-D tensor (Qwen3 / OLMo2 q-norm, k-norm)
LAYOUTS = [("3d", (2, 5, 16), 0), ("heads4d", (2, 3, 32), 4), ("2d", (6, 12), 0)]

BASE = Spelling()
ONE_AXIS = ([BASE.but(square=v) for v in SQUARES] + [BASE.but(reduce=v) for v in REDUCES]
            + [BASE.but(inverse=v) for v in INVERSES] + [BASE.but(eps_first=True)]
            + [BASE.but(weight=v) for v in WEIGHTS] + [BASE.but(cast=v) for v in CASTS])


def _id(sp: Spelling) -> str:
    diff = [f"{k}={v}" for k, v in vars(sp).items() if getattr(BASE, k) != v]
    return ",".join(diff) or "base"


def check_fuses(sp: Spelling, shape, heads=0, dtype=torch.float32, wdtype=None, post="residual"):
    torch.manual_seed(0)
    model = NormModule(sp, shape[-1], wdtype=wdtype or dtype, heads=heads, post=post)
    x = torch.randn(*shape, dtype=dtype)
    program = fused_program(model, x)
    nodes = rms_nodes(program)
    assert len(nodes) == 1, program.gm.graph
    (node,) = nodes
    assert (node.args[1] is not None) == (sp.weight != "none"), "weight folded iff the spelling has one"
    assert node.args[2] == pytest.approx(sp.eps)
    leftover = {n.target for n in program.gm.graph.nodes if n.op == "call_function"}
    for op in (torch.ops.aten.rsqrt.default, torch.ops.aten.sqrt.default, torch.ops.aten.pow.Tensor_Scalar,
               torch.ops.aten.mean.dim, torch.ops.aten.sum.dim_IntList):
        assert op not in leftover, f"{op} left after fusion:\n{program.gm.graph}"
    assert_matches_eager(model, program, x)
    return program, node, model


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout,shape,heads", LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
@pytest.mark.parametrize("sp", ONE_AXIS, ids=_id)
def test_each_spelling_fuses(sp, layout, shape, heads, dtype):
    check_fuses(sp, shape, heads, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("cast", CASTS)
def test_casts_times_weight_positions(cast, weight, dtype):
    check_fuses(BASE.but(cast=cast, weight=weight), (2, 5, 16), 0, dtype)


@pytest.mark.parametrize("inverse", INVERSES)
@pytest.mark.parametrize("weight", WEIGHTS)
def test_inverses_times_weight_positions(inverse, weight):
    check_fuses(BASE.but(inverse=inverse, weight=weight, square="mul", reduce="sum_div", eps_first=True),
                (2, 4, 3, 8), 0, torch.float32)


@pytest.mark.parametrize("cast", ["none", "llama", "gptoss", "t5"])
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float16), (torch.float16, torch.float32),
                                          (torch.bfloat16, torch.float32), (torch.bfloat16, torch.float16)],
                         ids=str)
def test_weight_in_other_dtype(dtype, wdtype, cast):
    program, node, model = check_fuses(BASE.but(cast=cast), (2, 5, 16), 0, dtype, wdtype=wdtype)
    # the weight is widened (exactly) to the compute dtype at compile time, not at run time
    assert node.args[1].op == "get_attr"
    weight = program.constant(node.args[1])
    assert weight.dtype == node.args[0].meta["val"].dtype
    assert torch.equal(weight.double(), model.weight.detach().double())


def test_gemma_weight_is_folded_to_one_plus_w():
    sp = BASE.but(weight="gemma", cast="gptoss")
    program, node, model = check_fuses(sp, (2, 5, 16), 0, torch.bfloat16, wdtype=torch.float32)
    folded = program.constant(node.args[1])
    torch.testing.assert_close(folded, 1.0 + model.weight.detach(), rtol=0, atol=0)


def test_no_ops_left_around_the_fused_node_in_float32():
    """Casts to float32 and back are no-ops in a float32 model: the fused node takes the
    input directly and nothing of the spelling survives."""
    program, node, _ = check_fuses(BASE.but(cast="llama"), (2, 5, 16), 0, torch.float32, post="none")
    ops = [n for n in program.gm.graph.nodes if n.op == "call_function"]
    assert ops == [node]


@pytest.mark.parametrize("eps", [1e-12, 1e-8, 1e-5, 1e-2, 0.0])
def test_eps_value_is_kept(eps):
    check_fuses(BASE.but(eps=eps, inverse="pow_m05"), (3, 8), 0, torch.float32)


# ---------------------------------------------------------------- transformers modules

def _hf_norms():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    return {"llama": LlamaRMSNorm, "gemma": GemmaRMSNorm, "gpt_oss": GptOssRMSNorm, "olmo2": Olmo2RMSNorm,
            "qwen3": Qwen3RMSNorm, "t5": T5LayerNorm}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["llama", "gemma", "gpt_oss", "olmo2", "qwen3", "t5"])
def test_transformers_norm_modules(name, dtype):
    """The real module classes, in each dtype, on a 4-D head layout (q-norm/k-norm)."""
    norm = _hf_norms()[name](8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8) * 0.2 + (0.0 if name == "gemma" else 1.0))
    norm = norm.to(dtype)
    x = torch.randn(2, 3, 4, 8, dtype=dtype)
    program = fused_program(norm, x)
    nodes = rms_nodes(program)
    assert len(nodes) == 1 and nodes[0].args[1] is not None, program.gm.graph
    assert_matches_eager(norm, program, x)


# ----------------------------------------------------------------------------- onert

ONERT_CASES = [BASE, BASE.but(square="mul", reduce="sum_div", inverse="div_sqrt"),
               BASE.but(square="square", reduce="mean_pos", inverse="reciprocal_sqrt", weight="before"),
               BASE.but(inverse="pow_m05", eps_first=True, weight="inside"),
               BASE.but(inverse="one_over_sqrt", weight="on_scale", reduce="sum_mul"),
               BASE.but(weight="none"), BASE.but(weight="gemma", cast="gptoss"), BASE.but(cast="llama"),
               BASE.but(cast="t5"), BASE.but(cast="double", square="pow_float")]


@pytest.mark.parametrize("layout,shape,heads", LAYOUTS + [("1d", (12,), 0)],
                         ids=[lay[0] for lay in LAYOUTS] + ["1d"])
@pytest.mark.parametrize("sp", ONERT_CASES, ids=_id)
def test_onert_float32(sp, layout, shape, heads):
    """Exported model in onert (float32): one RMS_NORM, output equal to eager.

    onert's RMS_NORM takes only 3-D/4-D inputs; the 1-D and 2-D layouts check the reshape
    the emitter puts around it.
    """
    model = NormModule(sp, shape[-1], heads=heads, post="silu")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    cm = circle_fx.export(model, (x,))
    assert cm.op_histogram().get("RMS_NORM", 0) == 1, cm.op_histogram()
    (got,) = cm.run(x)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onert_float32_weight_stored_as_float16():
    model = NormModule(BASE, 16, wdtype=torch.float16)
    x = torch.randn(2, 5, 16)
    cm = circle_fx.export(model, (x,))
    assert cm.op_histogram().get("RMS_NORM", 0) == 1
    (got,) = cm.run(x)
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


DYNAMIC_CASES = [BASE, BASE.but(reduce="sum_div", square="mul"), BASE.but(reduce="sum_mul", inverse="div_sqrt"),
                 BASE.but(cast="llama", weight="gemma"), BASE.but(inverse="pow_m05", weight="inside")]


@pytest.mark.parametrize("sp", DYNAMIC_CASES, ids=_id)
def test_fuses_with_dynamic_batch_and_sequence(sp):
    """Only the normalised dim must be static: ``sum / N`` with N the last dim still
    becomes a mean when batch and sequence are dynamic."""
    from torch.export import Dim

    from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes

    model = NormModule(sp, 16)
    program = circle_fx.capture(model, (torch.randn(2, 5, 16),),
                                dynamic_shapes=({0: Dim("batch", max=64), 1: Dim("seq", max=64)},))
    run_passes(program, default_pipeline())
    run_passes(program, finalize_pipeline())
    assert len(rms_nodes(program)) == 1, program.gm.graph
    x = torch.randn(3, 7, 16)
    assert_matches_eager(model, program, x)


@pytest.mark.parametrize("wshape", [(1, 1, 16), (1, 16), (16,)], ids=str)
@pytest.mark.parametrize("weight", ["after", "before", "inside", "on_scale"])
def test_weight_with_leading_ones_is_folded(weight, wshape):
    """A ``[1, 1, D]`` weight is per-channel too: folded (as ``[D]``), same numerics."""
    model = NormModule(BASE.but(weight=weight), 16)
    with torch.no_grad():
        model.weight = torch.nn.Parameter(model.weight.detach().reshape(wshape).clone())
    x = torch.randn(2, 5, 16)
    program = fused_program(model, x)
    (node,) = rms_nodes(program)
    assert node.args[1] is not None and list(node.args[1].meta["val"].shape) == [16]
    assert_matches_eager(model, program, x)


class _EpsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("eps", torch.tensor(1e-5))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class _EpsInlineTensor(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(torch.tensor(1e-5) + x.pow(2).mean(-1, keepdim=True))


@pytest.mark.parametrize("cls", [_EpsBuffer, _EpsInlineTensor])
def test_eps_as_a_scalar_tensor(cls):
    model, x = cls(), torch.randn(2, 5, 16)
    program = fused_program(model, x)
    (node,) = rms_nodes(program)
    assert node.args[2] == pytest.approx(1e-5)
    assert_matches_eager(model, program, x)


class _MixedCasts(torch.nn.Module):
    """``x.to(torch.float32)`` and ``x.float()`` in one norm: one cast after canonicalization."""

    def forward(self, x):
        return (x.to(torch.float32) * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class _MeanWithDtype(torch.nn.Module):
    """``mean(..., dtype=torch.float32)`` on a float32 value: the dtype argument is a no-op."""

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(torch.mean(xf * xf, -1, True, dtype=torch.float32) + 1e-6)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [_MixedCasts, _MeanWithDtype])
def test_cast_spelling_variants(cls, dtype):
    model, x = cls(), torch.randn(2, 5, 16, dtype=dtype)
    program = fused_program(model, x)
    assert len(rms_nodes(program)) == 1, program.gm.graph
    assert_matches_eager(model, program, x)
