"""GGML block-quantized weights (``quantize="q8_0"`` / ``"q4_0"``).

The bytes are checked against the ``gguf`` package's reference quantizers (ggml's layout, bit for
bit); the exported graph (dequantized weights, run in eager) against the float model; the file by
``verify`` (block counts, byte counts, where GGML tensors may appear). onert 0.1.0's GGML kernels
are built for AVX-512: where the probe finds they cannot run, ``CircleModel.run`` must refuse with
a clear ``RuntimeFailure`` (not kill the process); where they run, onert must match the graph.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from circle_schema import circle

import circle_fx
from circle_fx import InputError, LegalizeError, QuantConfig, RuntimeFailure, VerifyError
from circle_fx.circle import ggml
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.circle.reader import read_circle
from circle_fx.quant.ggml import pack

gguf = pytest.importorskip("gguf", reason="the gguf package (test extras) holds ggml's reference quantizers")
from gguf import quants  # noqa: E402

GGUF_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def _weights(rows=64, cols=256, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    w[3] = 0  # an all-zero row: d = 0
    w[5, :32] = 1e-9  # a tiny block
    w[7, 40] = 2.0  # an outlier
    return w


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ------------------------------------------------------------------------- the byte layout
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_blocks_are_ggml_reference_bytes(kind):
    w = _weights()
    ours, _, _ = pack(torch.from_numpy(w), ggml.BY_NAME[kind], search=False)
    ref = quants.quantize(w, GGUF_TYPES[kind])
    assert ours.shape == ref.shape == (64, 256 // 32 * ggml.BY_NAME[kind].block_bytes)
    np.testing.assert_array_equal(ours.numpy(), ref)
    np.testing.assert_array_equal(ggml.dequantize(ggml.BY_NAME[kind], ref, w.shape),
                                  quants.dequantize(ref, GGUF_TYPES[kind]))


def test_q4_0_scale_search_lowers_every_block_error():
    w = _weights(rows=256)
    plain_blocks, plain, _ = pack(torch.from_numpy(w), ggml.Q4_0, search=False)
    searched, plain2, chosen = pack(torch.from_numpy(w), ggml.Q4_0)
    assert plain == pytest.approx(plain2)
    err = lambda b: ((ggml.dequantize(ggml.Q4_0, b.numpy(), w.shape) - w) ** 2).reshape(-1, 32).sum(-1)
    e_plain, e_search = err(plain_blocks), err(searched)
    assert (e_search <= e_plain * (1 + 1e-6)).all()  # never worse, block by block
    assert e_search.sum() == pytest.approx(chosen, rel=1e-4)
    assert chosen < 0.92 * plain, chosen / plain  # measured: 11 % lower on gaussian weights


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "int8"])
def test_merged_weight_quantized_part_by_part(kind, monkeypatch):
    """A merge_linears weight (StackedTensor) packs to the bytes of its concatenation without ever
    being concatenated (slicing it would materialize all parts for every chunk: a full-size copy)."""
    from circle_fx.program import StackedTensor
    from circle_fx.quant.weight_only import quantize_rows

    parts = [torch.from_numpy(_weights(rows=r)) for r in (40, 24, 8)]
    whole = torch.cat(parts)
    quantize = (lambda w: quantize_rows(w)) if kind == "int8" else (lambda w: pack(w, ggml.BY_NAME[kind])[:1])
    want = quantize(whole)

    def refuse(self):
        raise AssertionError("StackedTensor concatenated")

    monkeypatch.setattr(StackedTensor, "materialize", refuse)
    got = quantize(StackedTensor(parts))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_pack_rejects_bad_weights():
    with pytest.raises(ValueError, match="multiple of 32"):
        pack(torch.zeros(4, 48), ggml.Q8_0)
    w = torch.zeros(4, 64)
    w[2, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        pack(w, ggml.Q4_0)


# --------------------------------------------------------------------------------- export
def _llama(tie: bool, hidden=128, inter=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_cache=False, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval(), torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(1))


#: every linear and the table Q4_0, no calibration: the block packing these tests check (the q4_0 preset's
#: Q8_0 lm_head and data-free calibration: tests/quant/test_datafree.py)
ALL_Q4_0 = QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q4_0", calibration=None)


def _export(model, ids, quantize):
    quantize = ALL_Q4_0 if quantize == "q4_0" else quantize
    program = circle_fx.capture(model, (ids,))
    return circle_fx.api.lower(program, quantize=quantize), program


def _types(cm):
    cf = read_circle(cm.to_bytes())
    return cf, [t for t in cf.tensors if ggml.block_type(t.type) is not None]


@pytest.mark.parametrize("preset, kind, bound", [("q8_0", "q8_0", 0.03), ("q4_0", "q4_0", 0.25)])
def test_llama_exports_ggml_blocks_close_to_float(preset, kind, bound):
    """Graph (dequantized weights, eager) vs float logits, measured: q8_0 1.5 %, q4_0 17 %
    (random weights are the worst case for 16 levels); the file holds GGML types and is smaller."""
    model, ids = _llama(tie=False)
    with torch.no_grad():
        ref = model(ids).logits.numpy()
    cm, program = _export(model, ids, preset)
    graph = program.run(ids)[0].numpy()
    assert _rel(graph, ref) <= bound
    cf, blocks = _types(cm)
    want = ggml.BY_NAME[kind]
    fcs = [op for op in cf.operators if op.name == "FULLY_CONNECTED"]
    assert fcs and all(cf.tensors[op.inputs[1]].type == want.circle_type for op in fcs)
    assert all(len(op.inputs) < 3 or op.inputs[2] == -1 for op in fcs)
    float_cm = circle_fx.export(model, (ids,))
    assert cm.size < (0.3 if kind == "q8_0" else 0.17) * float_cm.size, (cm.size, float_cm.size)
    text = cm.summary()
    assert f"bits per weight: " in text and f"{kind} {want.bits_per_weight:.2f}" in text


def test_tied_q4_0_table_and_lm_head_share_one_buffer():
    model, ids = _llama(tie=True)
    cm, program = _export(model, ids, "q4_0")
    cf, blocks = _types(cm)
    head = [op for op in cf.operators if op.name == "FULLY_CONNECTED"][-1]
    gather = next(op for op in cf.operators if op.name == "GATHER" and cf.tensors[op.inputs[0]].type == ggml.Q4_0.circle_type)
    assert cf.tensors[head.inputs[1]].buffer == cf.tensors[gather.inputs[0]].buffer
    assert "linear+embedding -> q4_0 x1" in cm.summary()
    assert "squared error" in cm.summary()  # the search gain is reported


def test_q8_0_keeps_8_bit_embedding_rows_and_lm_head_option():
    model, ids = _llama(tie=True)
    cm, _ = _export(model, ids, "q8_0")
    assert "embedding -> uint8" in cm.summary() and "stored once per encoding" in cm.summary()
    cm, _ = _export(model, ids, QuantConfig(weights="q8_0", embedding="q4_0", lm_head="q4_0"))
    cf, blocks = _types(cm)
    assert {t.type_name for t in blocks} == {"GGML_Q8_0", "GGML_Q4_0"}
    assert "linear+embedding -> q4_0 x1" in cm.summary()  # the tied head follows lm_head=q4_0
    with pytest.raises(InputError, match="lm_head"):
        QuantConfig(weights="q8_0", lm_head="q5_0")


def test_overrides_set_the_mode_of_matching_linears():
    """Mixed precision by name: down_proj (its own weight) and the merged q/k/v of layer 0 (a merged
    weight matches when a member does) at q8_0, the other linears q4_0; typos and bad modes are errors."""
    model, ids = _llama(tie=False)
    cfg = QuantConfig(weights="q4_0", embedding="uint8-rows",
                      overrides={"*.mlp.down_proj": "q8_0", "model.layers.0.self_attn.v_proj": "q8_0"})
    cm, program = _export(model, ids, cfg)
    cf, blocks = _types(cm)
    fcs = [op for op in cf.operators if op.name == "FULLY_CONNECTED"]
    kinds = [cf.tensors[op.inputs[1]].type_name for op in fcs]
    # per layer: q/k/v merged, o, gate/up merged, down; then lm_head
    assert kinds == ["GGML_Q8_0", "GGML_Q4_0", "GGML_Q4_0", "GGML_Q8_0",
                     "GGML_Q4_0", "GGML_Q4_0", "GGML_Q4_0", "GGML_Q8_0", "GGML_Q4_0"], kinds
    with torch.no_grad():
        assert _rel(program.run(ids)[0].numpy(), model(ids).logits.numpy()) < 0.25
    text = cm.summary()  # which linears each override decided, layer indices folded
    assert "override '*.mlp.down_proj' -> q8_0: 2 linear(s): model.layers.{0-1}.mlp.down_proj" in text, text
    assert ("override 'model.layers.0.self_attn.v_proj' -> q8_0: 1 linear(s): model.layers.0.self_attn.q_proj"
            "+model.layers.0.self_attn.k_proj+model.layers.0.self_attn.v_proj") in text, text
    with pytest.raises(InputError, match=r"overrides=.*\['\*.mlp.dwn_proj'\] match no linear weight"):
        circle_fx.export(torch.nn.Linear(32, 4), (torch.randn(1, 32),), verbose=False,
                         quantize=QuantConfig(weights="q4_0", overrides={"*.mlp.dwn_proj": "q8_0"}))
    with pytest.raises(InputError, match="overrides=.*modes one of"):
        QuantConfig(weights="q4_0", overrides={"*.mlp.down_proj": "q5_0"})


def test_q4_0_mix_keeps_the_sensitive_linears_at_q8_0():
    """``quantize="q4_0-mix"`` is the mix measured within 8 % of float on SmolLM2 (benchmarks/README.md):
    lm_head, every MLP output projection and all linears of the first and last 2 layers at Q8_0, the
    rest and the embedding table Q4_0; ``q4_0`` keeps every linear Q4_0; overrides win."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, use_cache=False)).eval()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    cm = circle_fx.export(model, (ids,), quantize="q4_0-mix", verbose=False)
    enc = cm.report.quantization.encodings()
    for i in range(6):
        end = i in (0, 1, 4, 5)
        assert enc[f"model.layers.{i}.mlp.down_proj"] == "q8_0"
        assert enc[f"model.layers.{i}.self_attn.o_proj"] == ("q8_0" if end else "q4_0"), (i, enc)
        assert enc[f"model.layers.{i}.mlp.gate_proj+model.layers.{i}.mlp.up_proj"] == ("q8_0" if end else "q4_0")
    assert enc["lm_head"] == "q8_0" and enc["model.embed_tokens"] == "q4_0"
    assert "sensitive -> q8_0: 18 linear(s): " in cm.summary()
    pure = circle_fx.export(model, (ids,), quantize=ALL_Q4_0, verbose=False).report.quantization.encodings()
    assert set(pure.values()) == {"q4_0"} and pure.keys() == enc.keys()
    cfg = QuantConfig(weights="q4_0", sensitive="q8_0", end_layers=1, overrides={"model.layers.0.mlp.down_proj": "q4_0"})
    enc = circle_fx.export(model, (ids,), quantize=cfg, verbose=False).report.quantization.encodings()
    assert enc["model.layers.0.mlp.down_proj"] == "q4_0" and enc["model.layers.0.self_attn.o_proj"] == "q8_0"
    assert enc["model.layers.1.self_attn.o_proj"] == "q4_0" and enc["model.layers.5.self_attn.o_proj"] == "q8_0"
    if not ggml_unsupported_reason():
        with torch.no_grad():
            # measured 0.105 (random weights: 16 levels are their worst case, as in the test above)
            assert _rel(cm.run(ids)[0], model(ids).logits.numpy()) < 0.2
    with pytest.raises(InputError, match="end_layers"):
        QuantConfig(weights="q4_0", end_layers=-1)
    with pytest.raises(InputError, match="sensitive"):
        QuantConfig(weights="q4_0", sensitive="q5_0")


def test_cli_override_options(tmp_path, capsys):
    """``--quantize q4_0 --override PATTERN=MODE --embedding/--lm-head MODE``: the file follows them and
    the command prints the linears each override matched; a typo'd pattern or a bad spelling is a
    one-line error naming it, and nothing is written."""
    from circle_fx.cli import main

    out = str(tmp_path / "m.circle")
    assert main(["export", "circle_fx.demo:tiny_llama", "-o", out, "--quantize", "q4_0", "--embedding", "uint8-rows",
                 "--lm-head", "q8_0", "--override", "*.mlp.down_proj=q8_0", "--override", "*.o_proj=float"]) == 0
    text = capsys.readouterr().out
    assert "override '*.mlp.down_proj' -> q8_0: 2 linear(s): model.layers.{0-1}.mlp.down_proj" in text, text
    assert "override '*.o_proj' -> float: 2 linear(s): model.layers.{0-1}.self_attn.o_proj" in text, text
    cf = read_circle(out)
    kinds = [cf.tensors[op.inputs[1]].type_name for op in cf.operators if op.name == "FULLY_CONNECTED"]
    assert kinds == ["GGML_Q4_0", "FLOAT32", "GGML_Q4_0", "GGML_Q8_0"] * 2 + ["GGML_Q8_0"], kinds
    assert any(t.type_name == "UINT8" for t in cf.tensors)
    for argv, message in [(["--override", "*.mlp.dwn_proj=q8_0"], "['*.mlp.dwn_proj'] match no linear weight"),
                          (["--override", "down_proj"], "expected PATTERN=MODE"),
                          (["--override", "*.mlp.down_proj=q5_0"], "mode 'q5_0': expected one of"),
                          (["--lm-head", "q5_0"], "--lm-head: mode 'q5_0'")]:
        bad = str(tmp_path / "bad.circle")
        assert main(["export", "circle_fx.demo:tiny_llama", "-o", bad, "--quantize", "q4_0", *argv]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and not os.path.exists(bad), err
    assert main(["export", "circle_fx.demo:tiny_llama", "-o", out, "--override", "a=q8_0"]) == 1
    assert "pass --quantize too" in capsys.readouterr().err


def test_in_features_not_a_multiple_of_32_falls_back_to_int8():
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval()
    x = torch.randn(3, 48)
    cm, program = _export(model, x, "q4_0")
    text = cm.summary()
    assert "q4_0 -> int8: in_features 48 is not a multiple of 32" in text
    cf, blocks = _types(cm)
    assert len(blocks) == 1 and blocks[0].shape == [32, 64]
    add = [op for op in cf.operators if op.name == "ADD"]
    assert add, "the bias of the GGML linear is a separate ADD"
    with torch.no_grad():
        assert _rel(program.run(x)[0].numpy(), model(x).numpy()) < 0.1


def test_verify_checks_block_bytes():
    model, ids = _llama(tie=False)
    cm, _ = _export(model, ids, "q4_0")
    m = circle.Model.ModelT.InitFromPackedBuf(cm.to_bytes(), 0)
    sg = m.subgraphs[0]
    bad = next(t for t in sg.tensors if t.type == ggml.Q4_0.circle_type)
    bad.shape = [int(bad.shape[0]), int(bad.shape[1]) + 32]  # one block per row more than the buffer has
    import flatbuffers

    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), file_identifier=b"CIR0")
    with pytest.raises(VerifyError, match="blocks of 18 bytes"):
        circle_fx.verify(bytes(b.Output()))


def test_onert_runs_ggml_or_refuses_cleanly():
    """Where onert's GGML kernels run, the file matches the dequantized graph (ggml quantizes the
    activations per 32-block: ~0.4 % of |y| per layer); where they cannot (SIGILL without AVX-512),
    run() raises RuntimeFailure naming the reason, and this process lives on."""
    model, ids = _llama(tie=True)
    cm, program = _export(model, ids, "q4_0")
    why = ggml_unsupported_reason()
    if why:
        with pytest.raises(RuntimeFailure, match="GGML block-quantized weights.*cannot run on this machine"):
            cm.run(ids)
        return
    got = cm.run(ids)[0]
    assert _rel(got, program.run(ids)[0].numpy()) <= 0.03


def test_ggml_sessions_prepare_with_the_idle_cores(monkeypatch):
    """onert reads NUM_THREADS when it prepares a session: a GGML file's first run sees
    NUM_THREADS = the cores idle at that moment (ggml's threads spin-wait: two are faster with
    the second core idle, 2-10x slower with it busy), the variable is gone afterwards (a later
    float session keeps onert's default), and a host's own setting is kept."""
    from circle_fx.circle import ggml_support

    monkeypatch.delenv("NUM_THREADS", raising=False)
    monkeypatch.setattr(ggml_support, "ggml_thread_count", lambda: 1)
    seen = []
    real = ggml_support.ggml_threads

    def spy(active):
        seen.append(active)
        return real(active)

    with real(True):
        assert os.environ["NUM_THREADS"] == "1"
    assert "NUM_THREADS" not in os.environ
    monkeypatch.setattr(ggml_support, "ggml_thread_count", lambda: 2)
    with real(True):
        assert os.environ["NUM_THREADS"] == "2"
    monkeypatch.setenv("NUM_THREADS", "3")
    with real(True):
        assert os.environ["NUM_THREADS"] == "3"
    monkeypatch.delenv("NUM_THREADS")
    if ggml_unsupported_reason():
        pytest.skip("onert's GGML kernels cannot run on this CPU")
    import circle_fx.circle.runtime as runtime

    monkeypatch.setattr(runtime, "ggml_threads", spy)
    model = torch.nn.Linear(64, 8, bias=False).eval()
    x = torch.randn(1, 64)
    cm = circle_fx.export(model, (x,), quantize="q8_0", verbose=False)
    cm.run(x)
    cm.run(x)
    assert seen[:1] == [True] and not any(seen[1:]) and "NUM_THREADS" not in os.environ, seen


@pytest.mark.parametrize("cores, loadavg, want", [
    (2, "0.50 0.40 0.30 1/95 123", 2),    # only the reader runs: both cores idle
    (2, "1.90 1.80 1.70 2/95 123", 1),    # one other runnable task: one core left
    (2, "9.00 9.00 9.00 7/300 123", 1),   # oversubscribed: never below 1
    (1, "0.00 0.00 0.00 1/95 123", 1),    # pinned to one core
    (8, "3.00 3.00 3.00 4/200 123", 5),
    (2, "garbage", 1),                    # unreadable: the safe value
])
def test_idle_cores_reads_the_runnable_count(cores, loadavg, want):
    from circle_fx.circle.ggml_support import idle_cores

    assert idle_cores(cores, loadavg) == want


def test_ggml_thread_count_is_within_the_affinity():
    from circle_fx.circle.ggml_support import ggml_thread_count

    assert 1 <= ggml_thread_count() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_batched_input_reaches_the_ggml_kernel_flattened(kind, monkeypatch):
    """onert's ggml FULLY_CONNECTED aborts the host process on an input like [2, 3, in] (the
    float kernel flattens it): the ``ggml_rows`` legalization step RESHAPEs it to [rows, in], the
    peephole's FC rule keeps that RESHAPE (it asks ``limits``), and the check after it refuses a
    peephole that would not (verify's report: tests/lowerings/test_form_limits.py)."""
    from circle_fx.emit.legalize import peephole

    model = torch.nn.Linear(64, 32).eval()
    x = torch.randn(2, 3, 64)
    cm = circle_fx.export(model, (x,), quantize=kind)
    m = circle.Model.ModelT.InitFromPackedBuf(cm.to_bytes(), 0)
    sg = m.subgraphs[0]
    fcs = [op for op in sg.operators
           if m.operatorCodes[op.opcodeIndex].builtinCode == circle.BuiltinOperator.BuiltinOperator.FULLY_CONNECTED]
    assert fcs and all(len(sg.tensors[op.inputs[0]].shape) == 2 for op in fcs)
    if not ggml_unsupported_reason():
        with torch.no_grad():
            assert _rel(cm.run(x)[0], model(x).numpy()) < 0.1
    # the peephole's rule as it was (skip the RESHAPE): the check after it names the ggml_rows limit
    monkeypatch.setattr(peephole, "block_type", lambda t: None)
    with pytest.raises(LegalizeError, match="(?s)'peephole'.*ggml_rows: a GGML-weight FULLY_CONNECTED input of "
                                            "shape \\[2, 3, 64\\]"):
        circle_fx.export(model, (x,), quantize=kind)
