"""``export-llm --check N`` with ``--quantize`` (circle_fx/llm/quant_check.py): a good quantized
package passes and says how close it is; one with a wrong scale fails naming its KL and the
threshold; a package this host cannot run gives a one-line reason, never a traceback.

The model is ``llm_models.trained_llama`` (a tiny Llama trained ~4 s on fixed text): a
random-weight model's near-uniform logits cannot tell a broken quantization from a good one."""
from __future__ import annotations

import math
import os
import platform
import re

import pytest

from circle_fx.cli import main
from circle_fx.llm import quant_check
from circle_fx.quant import weight_only

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where llm_models.py lives
FACTORY = os.path.join(HERE, "llm_models.py") + ":trained_llama_factory"
#: the one linear the broken exports spoil: [64, 128] is a down_proj (its first, layer 0's)
DOWN_PROJ = (64, 128)


def _export(out, quantize, *extra, check=16):
    return main(["export-llm", FACTORY, "-o", str(out), "--max-seq-len", "32", "--prefill-len", "8",
                 "--quantize", quantize, *extra, "--check", str(check)])


def _numbers(text: str) -> tuple[float, float, float]:
    """(package KL, yardstick KL, threshold) from the report."""
    m = re.search(r"mean KL\(float \|\| package\) (\S+) nats = \S+ x the yardstick's (\S+) nats; threshold (\S+) nats",
                  text)
    assert m, text
    return tuple(float(v) for v in m.groups())


def _wrong_int8_scale(monkeypatch, factor=4.0):
    """int8 rows of one down_proj written with their scale x ``factor`` (the q values unchanged)."""
    real, hit = weight_only.quantize_rows, []

    def broken(w, unsigned=False):
        q, scale = real(w, unsigned)
        if tuple(w.shape) == DOWN_PROJ and not hit:
            hit.append(tuple(w.shape))
            scale = scale * factor
        return q, scale

    monkeypatch.setattr(weight_only, "quantize_rows", broken)
    return hit


def test_good_int8_package_passes_and_reports(tmp_path, capsys):
    out = tmp_path / "pkg"
    assert _export(out, "int8-weights", "--int8-rows") == 0
    text = capsys.readouterr().out
    assert "first diverging greedy token:" in text and "top-1 agreement with float:" in text
    kl, yard, threshold = _numbers(text)
    assert 0 < kl <= threshold and threshold == max(quant_check.KL_RATIO * yard, quant_check.KL_FLOOR)
    assert f"(quantized, {platform.machine()} onert)" in text  # --int8-rows: no GGML tensor, this host's onert
    assert os.path.exists(out / "manifest.json")


def test_wrong_scale_fails_naming_kl_and_threshold(tmp_path, capsys, monkeypatch):
    hit = _wrong_int8_scale(monkeypatch)
    out = tmp_path / "pkg"
    assert _export(out, "int8-weights", "--int8-rows") == 1
    assert hit == [DOWN_PROJ]
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("circle-fx export-llm: error: --check (quantized")
    kl, yard, threshold = _numbers(err)
    assert kl > threshold
    assert f"the mean KL {kl:.4g} nats is over the threshold {threshold:.4g}; nothing was written" in err
    assert not os.path.exists(out)


def test_threshold_is_a_ratio_of_the_yardstick_with_a_floor():
    def agreement(kl, yard):
        return quant_check.Agreement(prompt=[1], float_tokens=[2, 3], positions=3, top1=3, kl=kl, yardstick=yard,
                                     yardstick_top1=3, first_divergence=None, package_pick=None, where="test")

    assert agreement(0.24, 0.1).passed and not agreement(0.26, 0.1).passed
    assert agreement(9e-4, 0.0).passed and not agreement(1.1e-3, 0.0).passed  # the floor
    assert not agreement(math.nan, 0.1).passed
    line = "\n".join(agreement(0.26, 0.1).lines())
    assert "2.60 x the yardstick's 0.1 nats; threshold 0.25 nats" in line and quant_check.THRESHOLD_TEXT in line


def test_ggml_package_without_a_runtime_says_why(tmp_path, capsys, monkeypatch):
    """No AVX-512 for x86 onert's ggml kernels and no arm64 side: a one-line reason, nothing written."""
    from circle_fx.circle import arm64, ggml_support

    monkeypatch.setattr(ggml_support, "ggml_unsupported_reason", lambda: "no AVX-512 (test)")
    monkeypatch.setattr(arm64.Arm64Env, "missing", lambda self: "qemu-user is not installed (test)")
    out = tmp_path / "pkg"
    assert _export(out, "q8_0", check=4) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--check cannot run this package here" in err
    assert "no AVX-512 (test)" in err and "qemu-user is not installed (test)" in err and "nothing was written" in err
    assert not os.path.exists(out)


def _arm64_missing():
    from circle_fx.circle.arm64 import Arm64Env

    return Arm64Env().missing()


@pytest.mark.slow
@pytest.mark.skipif(bool(_arm64_missing()), reason="onert's aarch64 build under qemu is not set up here")
def test_q4_0_on_arm64_good_passes_wrong_scale_fails(tmp_path, capsys, monkeypatch):
    """q4_0 packages as a host without AVX-512 checks them: on onert's aarch64 build under qemu.
    A Q4_0 block scale x4 in one down_proj's written bytes must fail; the honest package pass."""
    from circle_fx.circle import ggml_support

    monkeypatch.setattr(ggml_support, "ggml_unsupported_reason", lambda: "no AVX-512 (test)")
    assert _export(tmp_path / "good", "q4_0", check=8) == 0
    text = capsys.readouterr().out
    assert "onert aarch64 under qemu" in text
    kl, _, threshold = _numbers(text)
    assert kl <= threshold

    real, hit = weight_only.ggml_pack, []

    def broken(w, kind, search=True, importance=None):
        blocks, plain, chosen = real(w, kind, search, importance)
        if tuple(w.shape) == DOWN_PROJ and not hit:
            hit.append(kind.name)
            rec = blocks.numpy().view(kind.record())
            rec["d"] = rec["d"] * 4
        return blocks, plain, chosen

    monkeypatch.setattr(weight_only, "ggml_pack", broken)
    assert _export(tmp_path / "broken", "q4_0", check=8) == 1
    assert hit == ["q4_0"]
    err = capsys.readouterr().err
    kl, _, threshold = _numbers(err)
    assert kl > threshold and "nothing was written" in err and "Traceback" not in err


def test_yardstick_rounds_every_weight_the_package_quantized_and_restores():
    """The yardstick finds each quantized weight by the manifest's names (merged q/k/v and gate/up
    keys, the tied table) and rounds it by its encoding; on exit the float weights are back."""
    import torch

    import circle_fx
    from llm_models import trained_llama

    model = trained_llama()
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, quantize="q4_0-mix", tokenizer=None)
    encodings = pkg.manifest["weights"]["decode"]
    assert any("+" in k for k in encodings)  # merged linears: the keys join their members
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    with quant_check.plain_rounding(model, encodings) as notes:
        assert notes == []
        changed = [m for m in linears if not torch.equal(m.weight, before[_param_name(model, m.weight)])]
        assert changed == linears
        hooked = [m for m in linears if m._forward_pre_hooks]
        assert hooked == [m for m in linears if isinstance(m, torch.nn.Linear)]
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not any(m._forward_pre_hooks for m in linears)


def _param_name(model, tensor):
    return next(n for n, p in model.named_parameters() if p is tensor)


def test_yardstick_rounds_a_tied_table_as_the_package_stores_it():
    """The q4_0 preset stores a tied table twice (lm_head Q8_0, lookup Q4_0: ``q8_0+q4_0``): the
    yardstick's lm_head reads the Q8_0 rounding and its lookup the Q4_0 one (Gemma 3: the lookup
    is a scaled Embedding subclass, whose scale must survive), and the float table is back after."""
    import torch

    import circle_fx
    from llm_models import tiny

    model = tiny("gemma3")
    head, table = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight is table.weight
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, quantize="q4_0", tokenizer=None)
    assert "q8_0+q4_0" in pkg.manifest["weights"]["decode"].values()
    w = head.weight.detach().clone()
    want = {enc: torch.from_numpy(quant_check._round_weight(w.numpy(), enc)) for enc in ("q8_0", "q4_0")}
    ids = torch.tensor([[3, 17, 99]])
    float_lookup = table(ids)
    with quant_check.plain_rounding(model, pkg.manifest["weights"]["decode"]) as notes:
        assert any("the table as q4_0" in n for n in notes), notes
        looked_up = table(ids)
        assert torch.equal(head.weight, want["q8_0"])  # the lm_head's rounding, outside the lookup
    scale = float_lookup / torch.nn.functional.embedding(ids, w)
    assert torch.allclose(looked_up, torch.nn.functional.embedding(ids, want["q4_0"]) * scale, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(looked_up, torch.nn.functional.embedding(ids, want["q8_0"]) * scale, atol=1e-6)
    assert torch.equal(head.weight, w) and not table._forward_pre_hooks and not table._forward_hooks
