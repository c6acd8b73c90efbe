"""``circle_fx.explain``: for every RMSNorm-like subgraph that did not fuse, say which
condition failed and point at the user's source line."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings

import circle_fx
from circle_fx.explain import ExplainResult, explain_report
from rms_cases import cases, expected_fusions

EPS = 1e-6


def _explain(module, shape=(2, 5, 16)):
    return circle_fx.explain(module, (torch.randn(*shape),))


def _only(result: ExplainResult):
    assert len(result.entries) == 1, result.format()
    return result.entries[0]


# Each near miss is written inline in forward: torch.export records the forward frame,
# so the reported source line is the line that holds the flaw.

class AxisOne(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + EPS)


class TwoAxes(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + EPS)


class NoKeepdim(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + EPS)


class Cube(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(3).abs().mean(-1, keepdim=True) + EPS)


class CubeNoAbs(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + EPS)


class EpsAfter(torch.nn.Module):
    def forward(self, x):
        return x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + EPS)


class VarianceReturned(torch.nn.Module):
    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + EPS), v


class MeanOfXY(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt((x * (x + 1)).mean(-1, keepdim=True) + EPS)


class LayerNormLike(torch.nn.Module):
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS)


class BadWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(5, 16) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class TwoNorms(torch.nn.Module):
    """One good norm, one near miss: one fusion and one entry."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        h = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))
        return h * torch.rsqrt(h.pow(2).mean(-2, keepdim=True) + EPS)


def _check(module, needle_reason: str, needle_source: str, check: str | None = None):
    entry = _only(_explain(module))
    assert needle_reason in entry.reason, entry.format()
    assert needle_source in entry.source, entry.format()
    assert "test_explain.py" in entry.source
    if check is not None:
        assert entry.check == check
    return entry


def test_axis_not_last():
    _check(AxisOne(), "reduces axis 1 of a 3-D tensor, not the last axis", "mean(1, keepdim=True)",
           "_check_last_axis")


def test_several_axes():
    _check(TwoAxes(), "reduces 2 axes", "mean((-2, -1)", "_check_last_axis")


def test_keepdim_false_readded_at_once_fuses():
    """``mean(-1).unsqueeze(-1)`` is ``keepdim=True``: it fuses, nothing to explain."""
    result = circle_fx.explain(NoKeepdim(), (torch.randn(2, 5, 16),))
    assert len(result.fused) == 1 and result.entries == [], result.format()


def test_pow3():
    _check(CubeNoAbs(), "found 3 where the pattern has 2", "pow(3)")
    _check(Cube(), "expected aten.pow.Tensor_Scalar, found %abs", "pow(3).abs()")


def test_eps_after_rsqrt():
    _check(EpsAfter(), "expected aten.rsqrt.default, found %add", "torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + EPS")


def test_interior_value_used_elsewhere():
    entry = _check(VarianceReturned(), "is also used outside the pattern", "x.pow(2).mean(-1, keepdim=True)")
    assert "%mean" in entry.reason


def test_mean_of_x_times_y():
    _check(MeanOfXY(), "expected aten.pow.Tensor_Scalar, found %mul", "(x * (x + 1)).mean(-1")


def test_layernorm():
    _check(LayerNormLike(), "LayerNorm", "c.pow(2).mean(-1", "_check_not_centred")


def test_weight_shape_mismatch_reported_on_the_fused_node():
    result = _explain(BadWeight())
    assert len(result.fused) == 1
    entry = _only(result)
    assert entry.kind == "rms_norm weight"
    assert entry.check == "_check_weight"
    assert "weight shape [5, 16] does not match the normalised dimension 16" in entry.reason


def test_good_and_bad_norm_in_one_model():
    result = _explain(TwoNorms())
    assert len(result.fused) == 1 and result.fused[0].kind == "rms_norm"
    assert "self.weight * (x * torch.rsqrt" in result.fused[0].source
    entry = _only(result)
    assert "mean(-2, keepdim=True)" in entry.source and "not the last axis" in entry.reason
    text = result.format()
    assert "fused: 1" in text and "not fused: 1" in text and "_check_last_axis" in text


def test_nothing_to_report_when_everything_fuses():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    result = _explain(LlamaRMSNorm(16))
    assert result.entries == [] and len(result.fused) == 1
    assert "no near misses" in result.format()


def test_report_text_and_export():
    model, x = AxisOne(), torch.randn(2, 5, 16)
    text = explain_report(model, (x,))
    assert text == circle_fx.explain(model, (x,)).format()
    assert "not fused: 1" in text and "test_explain.py" in text and "mean(1, keepdim=True)" in text
    assert "explain" in circle_fx.__all__
    assert list(iter(circle_fx.explain(model, (x,)))) != []


def test_explain_does_not_touch_the_model():
    model = BadWeight()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _explain(model)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_tiny_llama_fuses_everything(tiny_llama):
    model, inputs = tiny_llama
    result = circle_fx.explain(model, inputs)
    assert result.entries == [], result.format()
    # input and post-attention norm per layer, plus the final norm
    assert len(result.fused) == 2 * model.config.num_hidden_layers + 1 == 5


EXPLAIN_FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@EXPLAIN_FUZZ
@given(cases(flawed=True, dtypes=(torch.float32, torch.bfloat16)))
def test_every_random_near_miss_is_explained(case):
    """Whatever the flaw and spelling, a norm that did not fully fuse gets an entry with a
    reason; the entry points at the module's source."""
    model, x = case.build()
    result = circle_fx.explain(model, (x,))
    count, _ = expected_fusions(case.sp)
    assert len(result.fused) == count
    assert len(result.entries) >= 1, result.format()
    for e in result.entries:
        assert e.reason and "rms_cases.py" in e.source, e.format()


@EXPLAIN_FUZZ
@given(cases(flawed=False, dtypes=(torch.float32, torch.float16)))
def test_no_entries_for_random_spellings_that_fuse(case):
    model, x = case.build()
    result = circle_fx.explain(model, (x,))
    assert len(result.fused) == 1 and result.entries == [], result.format()


class _CumsumOfMaskedRows(torch.nn.Module):
    """``out[m] = cumsum(x[m], 0)``: a running sum across the selected rows, so computing it
    on every row would change the values; masked_rows' ``row_wise`` check refuses it."""

    def forward(self, x):
        m = x[:, 0] > 0
        out = torch.zeros_like(x)
        out[m] = torch.cumsum(x[m], 0)
        return out


def test_rewrite_rule_near_miss_is_explained():
    """The rewrites no fusion family owns are pattern rules too: explain names the rule and
    the check that refused it, and a plain single-tensor index is no near miss."""
    result = circle_fx.explain(_CumsumOfMaskedRows(), (torch.randn(6, 4),))
    entries = [e for e in result.entries if e.kind == "rewrite masked_rows"]
    assert len(entries) == 1, result.format()
    assert entries[0].check == "row_wise" and "cumsum" in entries[0].reason
    assert "index_put" in entries[0].candidate
    plain = circle_fx.explain(_Gathers(), (torch.randn(6, 4),))
    assert not [e for e in plain.entries if e.kind.startswith("rewrite")], plain.format()


class _Gathers(torch.nn.Module):
    def forward(self, x):
        return x[torch.tensor([0, 2])].sum(0) + torch.gather(x, 1, torch.zeros(6, 4, dtype=torch.long))
