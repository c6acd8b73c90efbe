"""The q4_0 default a user gets without calibration text (issue 33 items 3 and 7).

``quantize="q4_0"`` keeps the lm_head (here tied to the embedding) at Q8_0 and weights the Q4_0
scales by data-free calibration (:mod:`circle_fx.quant.datafree`: text the model generates);
``summary()`` says what it was calibrated on, or why not. Checked on a small Llama whose norms
give a few input columns large activations (what a trained LLM's residual stream has; a random
model has none): the default's logits must be closer to float than the plain search's. And a
weight-only export imports no torchao and prints nothing (a fresh process).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import circle_fx
from circle_fx import InputError, QuantConfig
from circle_fx.quant.config import from_options
from circle_fx.quant.plan import quant_plan

transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # outlier channels: the norms' gains make a few input columns loud
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[[3, 17, 40]] = 25.0
    return model


def _ids():
    return torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(5))


def _quantized_logits(model, ids, quantize):
    """Logits of the exported graph run in eager (the file's dequantized weights: no GGML kernel
    is needed, onert's x86 build has none without AVX-512), and the CircleModel."""
    plan = quant_plan(quantize).calibrated(model)
    program = circle_fx.capture(model, (ids,), example_kwargs={"use_cache": False})
    cm = circle_fx.api.lower(program, quantize=plan)
    with torch.no_grad():
        return program.run(ids)[0], cm


def test_q4_0_default_is_calibrated_data_free_and_beats_the_plain_search():
    model, ids = _llama(), _ids()
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    default, cm = _quantized_logits(model, ids, "q4_0")
    plain, cm_plain = _quantized_logits(model, ids, QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q8_0",
                                                               calibration=None))
    err, err_plain = float(((default - ref) ** 2).mean()), float(((plain - ref) ** 2).mean())
    assert err < 0.8 * err_plain, (err, err_plain)
    text = cm.summary()
    assert "calibrated on" in text and "data-free tokens (seeded random token ids" in text, text
    imp = cm.report.quantization.config.importance
    assert imp is not None and imp.rows > 0 and "data-free" in imp.source
    assert "not calibrated: QuantConfig(calibration=None)" in cm_plain.summary()


def test_lm_head_is_q8_0_by_default_and_q4_0_when_asked():
    model, ids = _llama(), _ids()
    def head(quantize):
        cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False}, quantize=quantize)
        record = cm.report.quantization
        assert record.encodings()["model.layers.0.mlp.down_proj"] == "q4_0"
        return {(kind, dtype) for name, kind, _, dtype in record.quantized if name == "lm_head.weight"}

    # tied to the table: the linear reads a Q8_0 copy, GATHER the Q4_0 table (onert has no Q8_0 GATHER)
    assert head("q4_0") == {("linear", "q8_0"), ("embedding", "q4_0")}
    assert head(from_options("q4_0", lm_head="q4_0")) == {("linear+embedding", "q4_0")}  # one buffer


def test_a_model_that_cannot_generate_is_not_calibrated_and_says_why():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval()
    cm = circle_fx.export(model, (torch.randn(2, 64),), quantize="q4_0")
    assert "q4_0 scales: not calibrated: not a transformers causal LM" in cm.summary()
    cm = circle_fx.export(model, (torch.randn(2, 64),), quantize="q8_0")  # nothing to calibrate: no line
    assert "calibrat" not in cm.summary()
    with pytest.raises(InputError, match="calibration='text.txt'"):
        QuantConfig(weights="q4_0", calibration="text.txt")


QUIET = textwrap.dedent("""
    import contextlib, io, sys
    with contextlib.redirect_stderr(io.StringIO()):  # the caller's own imports may print: not ours
        import torch
        {setup}
    sys.stderr.write("MARK\\n"); sys.stderr.flush()
    import circle_fx
    for mode in ("int8-weights", "q8_0", "q4_0"):
        cm = circle_fx.export(model, (ids,), {kwargs}quantize=mode)
        cm.summary()
    sys.stderr.write("torchao=%s\\n" % ("torchao" in sys.modules))
""")


def _quiet_run(setup, kwargs=""):
    code = QUIET.format(setup=textwrap.indent(textwrap.dedent(setup), " " * 4).strip(), kwargs=kwargs)
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    after = r.stderr.split("MARK\n", 1)[1]
    return r.stdout, after


def test_weight_only_exports_import_no_torchao_and_print_nothing():
    out, err = _quiet_run("""
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval()
        ids = torch.randn(2, 64)
    """)
    assert out == "" and err == "torchao=False\n", (out, err)


@pytest.mark.slow
def test_a_transformers_llm_export_prints_nothing_either():
    """transformers itself imports torchao (its quantizer registry) when the model is built: that is
    the caller's import; the export, data-free calibration included, adds no output."""
    out, err = _quiet_run("""
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=2)).eval()
        ids = torch.zeros(1, 8, dtype=torch.long)
    """, kwargs="example_kwargs={'use_cache': False}, ")
    assert out == "" and err.startswith("torchao="), (out, err)


def test_a_q8_0_lm_head_that_would_not_fit_onert_is_stored_q4_0(monkeypatch):
    """The q4_0 preset's Q8_0 lm_head is dropped to Q4_0, with a warning, when the estimate says
    the file would pass onert's 2 GiB (here: the limit lowered to below a tiny tied Gemma 3's
    size); under the limit the tied table is stored twice, q8_0 for the lm_head."""
    import pytest

    import circle_fx
    from circle_fx.circle import runtime
    from llm_models import tiny

    model = tiny("gemma3")
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, quantize="q4_0", tokenizer=None)
    assert "q8_0+q4_0" in pkg.manifest["weights"]["decode"].values()
    monkeypatch.setattr(runtime, "ONERT_FILE_LIMIT", 20_000)
    with pytest.warns(UserWarning, match="lm_head stored q4_0, not q8_0"):
        pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, quantize="q4_0", tokenizer=None)
    encodings = set(pkg.manifest["weights"]["decode"].values())
    assert "q8_0+q4_0" not in encodings and "q8_0" not in encodings, encodings
