"""RMSNorm spellings as data, for the spelling, near-miss and fuzz tests.

A :class:`Spelling` names one choice per degree of freedom seen in real code (how ``x**2``
is written, how the mean is taken, how ``1/sqrt`` is written, where the weight and the
casts go); :class:`NormModule` composes them into an ``nn.Module`` so a test (or a
Hypothesis strategy) can build any combination. A ``flaw`` turns the spelling into a near
miss that must *not* fuse; :func:`expected_fusions` says what the fusion should produce.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from hypothesis import event, note
from hypothesis import strategies as st

import circle_fx
from circle_fx.fusions.rms_norm import rms_norm
from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes

SQUARES = ("pow", "pow_float", "mul", "square")
#: "..._unsqueeze" / "mean_index": keepdim=False with the dim re-added at once (== keepdim=True);
#: "vector_norm": ``linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / D`` (square and reduce in one)
REDUCES = ("mean", "mean_pos", "sum_div", "sum_mul", "mean_unsqueeze", "mean_index", "sum_div_unsqueeze",
           "vector_norm")
INVERSES = ("rsqrt", "one_over_sqrt", "reciprocal_sqrt", "div_sqrt", "pow_m05")
WEIGHTS = ("none", "after", "before", "inside", "on_scale", "gemma")
CASTS = ("none", "llama", "gptoss", "t5", "double")
#: near misses: each must leave the normalisation unfused (see expected_fusions)
FLAWS = ("axis", "axes", "nokeep", "pow3", "eps_after", "var_used", "scale_used", "xy", "layernorm",
         "weight_shape")


@dataclass(frozen=True)
class Spelling:
    square: str = "pow"
    reduce: str = "mean"
    inverse: str = "rsqrt"
    eps_first: bool = False
    weight: str = "after"
    cast: str = "none"
    eps: float = 1e-6
    flaw: str = "none"

    def but(self, **kw) -> "Spelling":
        return replace(self, **kw)


def expected_fusions(sp: Spelling) -> tuple[int, bool]:
    """``(number of circle.rms_norm nodes, weight folded in?)`` the passes must produce."""
    if sp.flaw == "none":
        return 1, sp.weight != "none"
    if sp.flaw == "weight_shape":
        # The unweighted core is a genuine RMSNorm and fuses; the mismatching mul stays
        # outside. When the weight sits *between* x and the scale it splits the core, so
        # nothing is left to fuse.
        return (0, False) if weight_inside(sp) else (1, False)
    return 0, False


def weight_inside(sp: Spelling) -> bool:
    """Is the weight multiplied in before ``x`` meets the scale? (Llama's cast forces it after.)"""
    return sp.weight in ("inside", "on_scale") and sp.cast != "llama"


class NormModule(torch.nn.Module):
    """``pre -> [view to heads] -> rms-norm spelling (+ residual) -> [transpose] -> post``.

    ``rows`` is the size of the second-to-last dim of the normalised value; the
    "weight_shape" flaw uses a ``[rows, d]`` weight (broadcasts, but is not per-channel).
    """

    def __init__(self, sp: Spelling, dim: int, wdtype=torch.float32, pre: str = "none", post: str = "none",
                 heads: int = 0, rows: int = 1, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.sp, self.pre, self.post, self.heads = sp, pre, post, heads
        d = dim // heads if heads else dim
        self.d = d
        gemma = sp.weight == "gemma"
        w = torch.randn(d, generator=g) * (0.1 if gemma else 0.5) + (0.0 if gemma else 1.0)
        self.weight = torch.nn.Parameter(w.to(wdtype))
        self.bad_weight = torch.nn.Parameter((torch.rand(rows, d, generator=g) + 0.5).to(wdtype))
        if pre == "linear":
            self.lin = torch.nn.Linear(dim, dim)
            with torch.no_grad():
                self.lin.weight.copy_(torch.randn(dim, dim, generator=g) / dim ** 0.5)
                self.lin.bias.copy_(torch.randn(dim, generator=g) * 0.1)

    # ------------------------------------------------------------------ pieces
    def _square(self, v):
        sp = self.sp
        if sp.flaw == "pow3":
            return v.pow(3)
        if sp.flaw == "xy":
            return v * (v + 1.0)
        return {"pow": lambda: v.pow(2), "pow_float": lambda: v ** 2.0, "mul": lambda: v * v,
                "square": lambda: torch.square(v)}[sp.square]()

    def _reduce(self, s):
        sp, n = self.sp, s.shape[-1]
        mean = sp.reduce.startswith("mean")
        if sp.flaw == "axis":
            return s.mean(-2, keepdim=True) if mean else s.sum(-2, keepdim=True) / s.shape[-2]
        if sp.flaw == "axes":
            return s.mean((-2, -1), keepdim=True)
        if sp.flaw == "nokeep":  # the dim is never re-added: broadcasts along the last axis (rows == D)
            return s.mean(-1) if mean else s.sum(-1) / n
        return {"mean": lambda: s.mean(-1, keepdim=True),
                "mean_unsqueeze": lambda: s.mean(-1).unsqueeze(-1),
                "mean_index": lambda: s.mean(-1)[..., None],
                "sum_div_unsqueeze": lambda: (s.sum(-1) / n).unsqueeze(-1),
                "vector_norm": lambda: s.mean(-1, keepdim=True),  # only with a square/axis flaw (_variance)
                "mean_pos": lambda: torch.mean(s, dim=s.dim() - 1, keepdim=True),
                "sum_div": lambda: s.sum(-1, keepdim=True) / n,
                "sum_mul": lambda: torch.sum(s, dim=[-1], keepdim=True) * (1.0 / n)}[sp.reduce]()

    def _variance(self, v):
        """``mean(v**2)`` in the chosen spelling (square flaws and axis flaws apply to the
        ``vector_norm`` spelling too: it then falls back to the plain square + mean)."""
        sp = self.sp
        if sp.reduce == "vector_norm" and sp.flaw not in ("pow3", "xy", "axis", "axes", "nokeep"):
            return torch.linalg.vector_norm(v, dim=-1, keepdim=True).pow(2) / v.shape[-1]
        return self._reduce(self._square(v))

    def _w(self):
        if self.sp.flaw == "weight_shape":
            return self.bad_weight
        if self.sp.weight == "gemma":
            return 1.0 + self.weight
        return self.weight

    def _normalise(self, h, var):
        """``h / rms`` in the chosen spelling, weight included when it goes inside;
        returns the value and the interior node a "scale_used" flaw leaks."""
        sp = self.sp
        w = self._w()
        inside = weight_inside(sp)
        hw = h * w if sp.weight == "inside" and inside else h
        if sp.flaw == "eps_after":
            if sp.inverse == "div_sqrt":
                root = torch.sqrt(var) + sp.eps
                return (h * (w / root) if sp.weight == "on_scale" and inside else hw / root), root
            scale = torch.rsqrt(var) + sp.eps
        else:
            ve = (sp.eps + var) if sp.eps_first else (var + sp.eps)
            if sp.inverse == "div_sqrt":
                root = torch.sqrt(ve)
                return (h * (w / root) if sp.weight == "on_scale" and inside else hw / root), root
            scale = {"rsqrt": lambda: torch.rsqrt(ve), "one_over_sqrt": lambda: 1 / torch.sqrt(ve),
                     "reciprocal_sqrt": lambda: torch.reciprocal(torch.sqrt(ve)),
                     "pow_m05": lambda: torch.pow(ve, -0.5)}[sp.inverse]()
        if sp.weight == "on_scale" and inside:
            return h * (scale * w), scale
        return hw * scale, scale

    def _weight_outside(self, y):
        sp = self.sp
        if sp.weight == "none" or weight_inside(sp):
            return y
        w = self._w()
        return w * y if sp.weight == "before" else y * w

    def norm(self, x):
        sp = self.sp
        dt = x.dtype
        if sp.flaw == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        if sp.cast in ("llama", "gptoss"):          # one up-cast copy used everywhere
            h = x.to(torch.float32)
            var = self._variance(h)
        elif sp.cast == "double":                   # x.float() written twice
            h = x.float()
            var = self._variance(x.float())
        elif sp.cast == "t5":                       # only the variance is up-cast
            h = x
            var = self._variance(x.to(torch.float32))
        else:
            h = x
            var = self._variance(h)
        y, interior = self._normalise(h, var)
        if sp.cast == "llama":                      # cast back, then the weight
            y = self._weight_outside(y.to(dt))
        elif sp.cast == "t5":
            if self.weight.dtype in (torch.float16, torch.bfloat16):
                y = y.to(self.weight.dtype)
            y = self._weight_outside(y)
        else:
            y = self._weight_outside(y)
            if sp.cast in ("gptoss", "double"):     # weight, then cast back
                y = y.to(dt)
        return y, var, interior

    def forward(self, x):
        if self.pre == "affine":
            x = x * 1.5 + 0.25
        elif self.pre == "linear":
            x = self.lin(x)
        if self.heads:
            x = x.view(*x.shape[:-1], self.heads, self.d)
        y, var, interior = self.norm(x)
        if self.post == "residual":
            y = y + x
        elif self.post == "silu":
            y = torch.nn.functional.silu(y)
        if self.heads:
            y = y.transpose(-3, -2)
        if self.sp.flaw == "var_used":
            return y, var
        if self.sp.flaw == "scale_used":
            return y, interior
        return y


# --------------------------------------------------------------------- running

def fused_program(model, x):
    """Capture ``model`` and run the default + final pipelines (what ``lower`` does)."""
    program = circle_fx.capture(model, (x,))
    run_passes(program, default_pipeline())
    run_passes(program, finalize_pipeline())
    return program


def rms_nodes(program):
    return [n for n in program.gm.graph.nodes if n.op == "call_function" and n.target is rms_norm]


def rms_epsilon(op) -> float:
    """The epsilon stored in a Circle RMS_NORM operator (an ``OperatorView`` of ``read_circle``)."""
    from circle_schema import circle

    table = op.raw.BuiltinOptions()
    opts = circle.RmsNormOptions.RmsNormOptions()
    opts.Init(table.Bytes, table.Pos)
    return opts.Epsilon()


def tolerance(dtype) -> dict:
    """FX-level tolerance: float32 1e-5; half types a few units of their precision.

    The fused op accumulates in float32 while a half-precision eager spelling may round
    after every step, so the two differ by several half-precision ulps.
    """
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5)
    eps = torch.finfo(dtype).eps
    return dict(rtol=4 * eps, atol=4 * eps)


def as_tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def assert_matches_eager(model, program, x, out_dtype_check=True):
    with torch.no_grad():
        ref = as_tuple(model(x))
    got = program.run(x)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        if out_dtype_check:
            assert g.dtype == r.dtype, (g.dtype, r.dtype)
        tol = tolerance(least_precise([x.dtype, r.dtype] + [p.dtype for p in model.parameters()]))
        torch.testing.assert_close(g.float(), r.float(), equal_nan=True, **tol)


def assert_onert_fuses_and_matches(model, x, count: int):
    """``model`` exported and run in onert: ``count`` RMS_NORM ops, every output equal to eager
    within 1e-5 (float32 cases)."""
    cm = circle_fx.export(model, (x,))
    assert cm.op_histogram().get("RMS_NORM", 0) == count, cm.op_histogram()
    got = cm.run(x)
    with torch.no_grad():
        want = as_tuple(model(x))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


def least_precise(dtypes):
    """Tolerances follow the least precise dtype anywhere in the computation."""
    for dt in (torch.bfloat16, torch.float16):
        if dt in dtypes:
            return dt
    return torch.float32


# ------------------------------------------------------------ hypothesis strategies

EPS = st.sampled_from([1e-6, 1e-5, 1e-12]) | st.floats(1e-9, 1e-2, allow_nan=False)

spellings = st.builds(Spelling, square=st.sampled_from(SQUARES), reduce=st.sampled_from(REDUCES),
                      inverse=st.sampled_from(INVERSES), eps_first=st.booleans(),
                      weight=st.sampled_from(WEIGHTS), cast=st.sampled_from(CASTS), eps=EPS)


@dataclass
class Case:
    sp: Spelling
    shape: tuple
    heads: int
    dtype: torch.dtype
    wdtype: torch.dtype
    pre: str
    post: str

    def build(self):
        rows = self.heads if self.heads else (self.shape[-2] if len(self.shape) > 1 else 1)
        model = NormModule(self.sp, self.shape[-1], wdtype=self.wdtype, pre=self.pre, post=self.post,
                           heads=self.heads, rows=rows)
        if self.pre == "linear":
            model.lin.to(self.dtype)
        x = torch.randn(*self.shape, generator=torch.Generator().manual_seed(hash(self.shape) % 1000))
        return model, x.to(self.dtype)


@st.composite
def cases(draw, flawed: bool, dtypes=(torch.float32, torch.float16, torch.bfloat16), onert=False):
    sp = draw(spellings)
    if flawed:
        flaw = draw(st.sampled_from(FLAWS))
        if flaw == "weight_shape" and sp.weight == "none":
            sp = sp.but(weight="after")
        sp = sp.but(flaw=flaw)
    dtype = draw(st.sampled_from(dtypes))
    others = [d for d in (torch.float32, torch.float16, torch.bfloat16) if d != dtype]
    if onert:
        # Circle/onert here is float32 only: a float16 weight is fine when it is folded into
        # the fused node (widened at compile time), but not in an unfused mul (onert cannot
        # CAST from float16), nor with T5's cast of the activations *to* the weight dtype.
        plain_fp16 = not flawed and sp.cast != "t5"
        wdtype = draw(st.sampled_from([dtype, dtype, torch.float16])) if plain_fp16 else dtype
    else:
        wdtype = draw(st.sampled_from([dtype, dtype] + others))
    needs_rows = sp.flaw in ("axis", "axes", "weight_shape")
    heads = draw(st.sampled_from([0, 0, 0, 2, 4]))
    d = draw(st.integers(2, 24))
    if sp.flaw == "nokeep":
        # a reduction without keepdim only broadcasts back against [1.., D, D] (along the wrong axis)
        shape = (1,) * draw(st.integers(0, 2)) + (d, d)
        heads = 0
    elif heads:
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), heads * d)
    else:
        rank = draw(st.integers(2 if needs_rows else 1, 4))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(rank - 1)) + (d,)
        if sp.flaw == "weight_shape" and shape[-2] == 1:
            # a [1, d] weight *is* per-channel: widen the rows so the flaw is a real mismatch
            shape = shape[:-2] + (draw(st.integers(2, 4)), d)
    pre = draw(st.sampled_from(["none", "affine", "linear"]))
    post = draw(st.sampled_from(["none", "residual", "silu"]))
    case = Case(sp, shape, heads, dtype, wdtype, pre, post)
    event(f"flaw={sp.flaw}" if flawed else f"cast={sp.cast} weight={sp.weight}")
    event(f"dtype={str(dtype)[6:]}" + (" heads" if heads else f" rank={len(shape)}"))
    note(repr(case))
    return case
