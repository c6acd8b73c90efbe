"""Every transformers causal-LM family that exports keeps exporting, fusing and matching.

The families are enumerated programmatically (``scripts/hf_families.py``: transformers'
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, tiny random configs); ``scripts/model_support.py``
records in ``docs/model-support.json`` which of them export and match. Every family recorded
as exported is tested here: export (default pipeline, unpatched), one ``RMS_NORM`` per
RMSNorm module the eager forward executes, onert vs eager within ``rtol=atol=1e-4``.

Families whose norms do not all fuse are strict xfails naming the counts. A few families
that exercise the general mechanisms (interleaved RoPE, complex RoPE + router scatter,
short conv, xIELU) run in the default suite; the rest are ``slow`` (about 100 models).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

import circle_fx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402

RTOL, ATOL = 1e-4, 1e-4
TABLE = os.path.join(ROOT, "docs", "model-support.json")
#: one family per general mechanism, in the default suite (the others are slow)
FAST = {"glm": "stack/flatten RoPE", "llama4_text": "complex RoPE, scatter router",
        "lfm2": "conv1d short convolution", "apertus": "xIELU (min.other, expm1)",
        "mamba": "selective-scan loop, constant-lhs matmul",
        "mamba2": "chunked SSD scan (cumsum, segsum, multi-chunk einsums)",
        "hy_v4": "unweighted RMSNorm applied after a linear (rms_norm_before_linear)",
        "cpmant": "default init std 1.0 capped (INIT_STD_MAX)"}


#: families whose tiny random model has small logits: the "outputs are not constant" check
#: asks for std > this x atol instead of 100 x atol
MIN_STD_OVER_ATOL = {"inkling_text": 50}


def _rows() -> list[dict]:
    with open(TABLE) as fh:
        return json.load(fh)


def _params():
    for row in _rows():
        if row["status"] != "ok":
            continue
        marks = [] if row["family"] in FAST else [pytest.mark.slow]
        if row.get("rms_modules", 0) != row.get("rms_fused", 0):
            marks.append(pytest.mark.xfail(strict=True, reason=f"{row['rms_modules']} RMSNorm calls but "
                                                               f"{row['rms_fused']} RMS_NORM ops"))
        yield pytest.param(row, id=row["family"], marks=marks)


def test_table_covers_every_enumerated_family():
    """docs/model-support.json was generated from this transformers: same families."""
    recorded = {r["family"] for r in _rows()}
    current = {f.model_type for f in hf.enumerate_families()}
    assert recorded == current, (sorted(current - recorded), sorted(recorded - current))


@pytest.mark.parametrize("family, kinds", [
    ("jamba", {"linear_attention", "full_attention"}),  # read-only layer_types (period/offset)
    ("recurrent_gemma", {"linear_attention", "sliding_attention"}),  # read-only (block_types pattern)
    ("zamba2", {"linear_attention", "hybrid"}),  # layer_types is an attribute_map alias
])
def test_tiny_config_keeps_every_layer_kind(family, kinds):
    """Families whose layer kinds are derived (a read-only property) or aliased still get one
    layer of each kind, and what the config derives from them agrees (Zamba2's hybrid ids)."""
    config = hf.tiny_config(family)
    assert set(config.layer_types) == kinds and config.num_hidden_layers <= 5
    if family == "zamba2":
        assert config.hybrid_layer_ids == [config.layer_types.index("hybrid")]


@pytest.mark.parametrize("row", _params())
def test_family_exports_fuses_and_matches_eager(row):
    torch.set_num_threads(1)
    model = hf.build(row["family"], row["class"])
    ids = hf.example_inputs(model)
    ref, executed = hf.eager_with_norm_calls(model, ids)
    cm = circle_fx.export(model, ids, example_kwargs=hf.example_kwargs(model), verbose=False)
    assert cm.op_histogram()["RMS_NORM"] == executed, cm.summary()
    out = cm.run(*ids)[0]
    expected = ref.detach().numpy()
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL,
                               err_msg=f"{row['family']}: max abs diff {np.abs(out - expected).max():.3g}")
    # the comparison can fail: the logits vary far beyond atol (100x; inkling_text's tiny
    # model has logits of std 0.007, still 70x atol: a wrong model differs by far more)
    assert float(expected.std()) > MIN_STD_OVER_ATOL.get(row["family"], 100) * ATOL


def test_composite_config_builds_the_part_its_causal_lm_takes():
    """``llama4`` maps to Llama4ForCausalLM, which takes ``Llama4Config.text_config`` (as
    AutoModelForCausalLM.from_config does); MusicGen's causal LM takes the ``decoder`` part."""
    assert type(hf.tiny_config("llama4", "Llama4ForCausalLM")).__name__ == "Llama4TextConfig"
    assert type(hf.tiny_config("musicgen", "MusicgenForCausalLM")).__name__ == "MusicgenDecoderConfig"
    fuyu = hf.tiny_config("fuyu", "FuyuForCausalLM")  # takes the composite: its text part is shrunk
    assert fuyu.text_config.hidden_size == hf.TINY["hidden_size"]


def test_huge_default_init_scale_is_capped_and_others_kept():
    """CPM-Ant's default ``init_std=1.0`` (plain ``nn.Linear``, no 1/sqrt(fan_in) in forward)
    made the tiny model's logits move by 2.8e-4 under one-ulp weight noise: it gets the usual
    0.02. Families at or below the cap keep their own scale."""
    cpm = hf.tiny_config("cpmant", "CpmAntForCausalLM")
    assert cpm.init_std == hf.INIT_STD and cpm.dim_head == hf.TINY["dim_head"] and cpm.dim_ff == hf.TINY["dim_ff"]
    assert hf.tiny_config("minicpm3", "MiniCPM3ForCausalLM").initializer_range == 0.1
    assert hf.tiny_config("llama", "LlamaForCausalLM").initializer_range == 0.02


def test_tiny_value_a_validator_names_reverts_to_the_default():
    """ZAYA's validator accepts only num_experts_per_tok=1: the tiny 2 reverts, the rest stays tiny."""
    config = hf.tiny_config("zaya", "ZayaForCausalLM")
    assert config.num_experts_per_tok == 1 and config.hidden_size == hf.TINY["hidden_size"]


def test_literal_per_layer_lists_follow_the_tiny_layer_count():
    """Reformer's ``attn_layers`` (a literal 6-entry default) is cut to the kept layers; lists
    the config derives itself (DeepSeek-V3.2's ``mlp_layer_types``) keep their derivation."""
    reformer = hf.tiny_config("reformer", "ReformerModelWithLMHead")
    assert list(reformer.attn_layers) == ["local", "lsh"]
    dsv32 = hf.tiny_config("deepseek_v32", "DeepseekV32ForCausalLM")
    assert dsv32.mlp_layer_types == ["dense", "sparse"]  # first_k_dense_replace=1 of 2 layers


def test_multimodal_wrapper_names_the_row_of_its_text_decoder():
    fams = {f.model_type: f for f in hf.enumerate_families()}
    assert "`gemma3_text` row" in fams["gemma3"].skip
    assert all(fams[f].skip is None for f in ("llama4", "mllama", "emu3", "fuyu", "dots3_note"))


def test_zero_initialised_router_gets_random_weights_and_matches():
    """transformers zero-initialises Afmoe's router gate: every expert scored 0.5, torch's topk
    and circle_fx's (ARG_MAX, lowest index first) broke the tie differently and the logits
    differed by 0.12. ``hf.build`` makes constant weight matrices random (real routers have no
    exact ties); then the family matches eager."""
    torch.set_num_threads(1)
    model = hf.build("afmoe", "AfmoeForCausalLM")
    gates = [n for n, p in model.named_parameters() if n.endswith("router.gate.weight")]
    assert gates and all(float(model.get_parameter(n).abs().max()) > 0 for n in gates)
    ids = hf.example_inputs(model)
    ref, executed = hf.eager_with_norm_calls(model, ids)
    cm = circle_fx.export(model, ids, example_kwargs=hf.example_kwargs(model), verbose=False)
    assert cm.op_histogram()["RMS_NORM"] == executed == 13
    out = cm.run(*ids)[0]
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=RTOL, atol=ATOL)


class TinyRMSNorm(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class TinyGatedRMSNorm(torch.nn.Module):
    """AXK2's spelling: a module named ...RMSNorm wrapping the norm, then a sigmoid gate."""

    def __init__(self, d=16):
        super().__init__()
        self.norm, self.gate = TinyRMSNorm(d), torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        y = self.norm(x)
        return y * torch.sigmoid(self.gate(y))


class _GatedNormLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.gated, self.final = torch.nn.Embedding(32, 16), TinyGatedRMSNorm(), TinyRMSNorm()
        self.head = torch.nn.Linear(16, 32, bias=False)

    def forward(self, input_ids):
        return (self.head(self.final(self.gated(self.emb(input_ids)))),)


def test_a_norm_wrapping_a_norm_counts_once():
    """AXK2 listed 12 RMSNorm calls for 9 RMS_NORM ops: its 3 GatedRMSNorm wrappers were
    counted besides the RMSNorm inside them. The wrapper's output (norm * gate) is no
    RMSNorm; every norm actually computed fuses."""
    model = _GatedNormLM().eval()
    ids = (torch.randint(0, 32, (1, 6), generator=torch.Generator().manual_seed(1)),)
    ref, executed = hf.eager_with_norm_calls(model, ids)
    assert executed == 2
    cm = circle_fx.export(model, ids, verbose=False)
    assert cm.op_histogram()["RMS_NORM"] == executed
    np.testing.assert_allclose(cm.run(*ids)[0], ref.detach().numpy(), rtol=RTOL, atol=ATOL)
