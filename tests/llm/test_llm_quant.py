"""export_llm(quantize="int8-weights"): the decode and prefill models carry int8 weights and
still run token by token in onert, close to the float model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.errors import InputError

from llm_models import tiny


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=32, prefill_len=8, quantize="int8-weights")
    directory = tmp_path_factory.mktemp("llm_int8")
    pkg.save(directory)
    return model, pkg, directory


def test_both_models_store_int8_linear_weights(quantized):
    _, pkg, directory = quantized
    for part in ("decode", "prefill"):
        cf = pkg.read(part)
        fc_weights = [cf.tensors[op.inputs[1]] for op in cf.operators if op.name == "FULLY_CONNECTED"]
        assert fc_weights and all(t.type_name == "INT8" for t in fc_weights), part
        assert sum(op.name == "RMS_NORM" for op in cf.operators) == 5, part


def test_quantized_decode_follows_the_float_model(quantized):
    model, pkg, directory = quantized
    runner = pkg.runner(directory)
    ids = [3, 17, 42, 5, 99, 64]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    got = [runner.step(t, p) for p, t in enumerate(ids)]
    got = np.stack(got)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 0.05, rel  # int8 weights + onert's per-row int8 activations: ~1-3% measured
    runner.reset()
    prefill = runner.run_prefill(ids)
    assert np.abs(prefill - got[-1]).max() / np.abs(got[-1]).max() < 0.02


def test_decode_and_prefill_share_each_quantized_weight(quantized):
    """export_llm quantizes each weight once: the two models' builders hold the same arrays, so a
    big model's packed weights are in memory once, not twice (and packed in half the time)."""
    _, pkg, _ = quantized
    decode, prefill = _big_quantized_arrays(pkg.decode), _big_quantized_arrays(pkg.prefill)
    assert decode and len(decode) == len(prefill)
    assert all(any(np.shares_memory(a, b) for b in prefill) for a in decode)


def _big_quantized_arrays(cm) -> list[np.ndarray]:
    """The int8/uint8 arrays (>= 1 KiB) a model's builder holds: every part of a stacked
    buffer (a merged weight is streamed part by part), each as its own array."""
    return [np.asarray(p) for b in cm.builder.buffers if b is not None and b.nbytes >= 1024
            and b.dtype in (np.int8, np.uint8) for p in (b.parts if hasattr(b, "parts") else [b])]


def test_bad_quantize_value_fails_before_capture():
    with pytest.raises(InputError, match="int4"):
        circle_fx.export_llm(tiny("llama"), max_seq_len=16, quantize="int4")


def test_cli_overrides_and_manifest_weight_formats(tmp_path, capsys):
    """``export-llm --quantize q4_0 --override ...``: the manifest records each weight's encoding under
    the model's own names (not the export wrapper's), the config, and num_threads 1 (safe) for the GGML
    kernels; the command prints the linears each override matched."""
    import json
    import os

    from circle_fx.cli import main

    factory = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llm_models.py")
    out = str(tmp_path / "pkg")
    assert main(["export-llm", f"{factory}:tiny_llama_factory", "-o", out, "--max-seq-len", "16", "--prefill-len",
                 "4", "--quantize", "q4_0", "--embedding", "uint8-rows", "--lm-head", "q8_0",
                 "--override", "model.layers.0.*=q8_0"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("override "))
    assert line.startswith("override 'model.layers.0.*' -> q8_0: 4 linear(s): ") and "model.layers.0.mlp.down_proj" in line
    w = json.load(open(os.path.join(out, "manifest.json")))["weights"]
    assert w["quantize"]["overrides"] == [["model.layers.0.*", "q8_0"]] and w["quantize"]["lm_head"] == "q8_0"
    for part in ("prefill", "decode"):
        enc = w[part]
        assert enc["model.layers.0.mlp.down_proj"] == "q8_0" and enc["model.layers.1.mlp.down_proj"] == "q4_0"
        assert enc["lm_head"] == "q8_0" and enc["model.embed_tokens"] == "uint8", enc
    assert w["ggml"] is True and w["num_threads"] == 1 and w["bits_per_weight"]["q4_0"] == 4.5
    from circle_fx.circle.ggml_support import ggml_unsupported_reason

    if not ggml_unsupported_reason():  # both sessions prepared with NUM_THREADS = idle cores
        from circle_fx.llm import LLMRunner

        runner = LLMRunner(out)
        assert np.isfinite(runner.step(3, 0)).all() and "NUM_THREADS" not in os.environ
    pkg = circle_fx.export_llm(tiny("llama"), max_seq_len=16, prefill_len=4)
    assert pkg.manifest["weights"]["quantize"] is None and pkg.manifest["weights"]["num_threads"] is None


@pytest.mark.slow  # a second export_llm (~15 s under load); the rule itself: tests/quant/test_quant_weights.py
def test_prefill_of_16_rows_gets_q8_0_blocks_decode_keeps_int8(tmp_path):
    """``QuantConfig.blocks_from_rows``: a prefill of >= 16 rows stores its linears as Q8_0 blocks
    (ggml's kernel, the fastest 8-bit form there), the 1-row decode keeps int8 rows; the manifest
    says so, and where onert's ggml kernels run the prefill agrees with decode steps."""
    from circle_fx.circle.ggml_support import ggml_unsupported_reason

    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=32, prefill_len=16, quantize="int8-weights")
    pkg.save(tmp_path)
    fc = {part: {pkg.read(part).tensors[op.inputs[1]].type_name
                 for op in pkg.read(part).operators if op.name == "FULLY_CONNECTED"}
          for part in ("decode", "prefill")}
    # the prefill's lm_head runs on the last row only: 1 row, int8 (tied with the table or not)
    assert fc["decode"] == {"INT8"} and "GGML_Q8_0" in fc["prefill"], fc
    w = pkg.manifest["weights"]
    assert set(w["decode"].values()) <= {"int8", "uint8"} and "q8_0" in w["prefill"].values(), w
    if ggml_unsupported_reason():
        pytest.skip(f"onert's GGML kernels do not run here: {ggml_unsupported_reason()}")
    runner = pkg.runner(tmp_path)
    ids = [3, 17, 42, 5, 99, 64]
    steps = np.stack([runner.step(t, p) for p, t in enumerate(ids)])
    runner.reset()
    prefill = runner.run_prefill(ids)
    assert np.abs(prefill - steps[-1]).max() / np.abs(steps[-1]).max() < 0.03
