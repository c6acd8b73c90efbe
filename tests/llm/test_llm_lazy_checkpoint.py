"""export-llm from a checkpoint with its weights streamed (``circle_fx/llm/weights.py``): the same
bytes as the in-memory path, no float weights held by the model, and bad checkpoints refused
with one error naming the file and the tensor before anything is written."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx import lazy
from circle_fx.cli import main
from circle_fx.errors import InputError
from circle_fx.llm.checkpoint import load_checkpoint
from llm_models import tiny


def _export(model, quantize):
    return circle_fx.export_llm(model, 16, 4, quantize=quantize, tokenizer=None)


def _same_bytes(ref, lz, quantize):
    """The same package from both; the in-memory model would get q4_0's data-free calibration, which
    a streamed one cannot run (checked by test_streamed_q4_0_is_not_calibrated_and_says_so): off here."""
    from dataclasses import replace

    from circle_fx.quant import resolve_quantize

    quantize = resolve_quantize(quantize)
    quantize = None if quantize is None else replace(quantize, calibration=None)
    a, b = _export(ref, quantize), _export(lz, quantize)
    assert a.manifest == b.manifest
    for k in ("decode", "prefill"):
        assert getattr(a, k).to_bytes() == getattr(b, k).to_bytes(), k


@pytest.mark.parametrize("family, quantize", [
    ("llama", "q4_0"), ("llama", None), ("gemma3", "int8-weights"),  # gemma3: tied table, 1 + w gammas
    pytest.param("qwen3", "q8_0", marks=pytest.mark.slow), pytest.param("lfm2", "q4_0", marks=pytest.mark.slow)])
def test_streamed_export_is_the_in_memory_export(tmp_path, family, quantize):
    d = str(tmp_path / family)
    tiny(family).save_pretrained(d)
    ref, _ = load_checkpoint(d, tokenizer=False, lazy=False)
    lz, _ = load_checkpoint(d, tokenizer=False)
    # the weightless model holds 4 bytes per parameter tensor, not its values
    held = sum(p.untyped_storage().nbytes() for p in lz.parameters())
    assert held <= 4 * len(list(lz.parameters())) < sum(p.numel() * 4 for p in ref.parameters()) // 100
    lazy.READS.clear()
    _same_bytes(ref, lz, quantize)
    assert lazy.READS == []  # no pass asked for a weight's values: only the packers and the writer read


def test_streamed_q4_0_is_not_calibrated_and_says_so(tmp_path):
    d = str(tmp_path / "llama")
    tiny("llama").save_pretrained(d)
    lz, _ = load_checkpoint(d, tokenizer=False)
    record = _export(lz, "q4_0").decode.report.quantization
    assert record.config.importance is None
    assert record.calibration_lines() == ["q4_0 scales: not calibrated: its weights are streamed from the "
                                          "checkpoint as they are packed (no float copy to run); --calibration "
                                          "FILE, or load it in memory, calibrates (plain scale search)"]


def _tiny_gguf(path, bad_type=False):
    """A 1-layer Llama GGUF written with gguf-py in llama.cpp's conventions (q/k rows permuted,
    shapes reversed); ``bad_type``: the down projection stored as I32, which nothing dequantizes."""
    import gguf

    torch.manual_seed(0)
    V, D, F, H, KV = 64, 32, 64, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in [("add_block_count", 1), ("add_context_length", 64), ("add_embedding_length", D),
                   ("add_feed_forward_length", F), ("add_head_count", H), ("add_head_count_kv", KV),
                   ("add_layer_norm_rms_eps", 1e-5), ("add_rope_dimension_count", D // H), ("add_vocab_size", V)]:
        getattr(w, key)(v)
    w.add_name("tiny")

    def permute(t, n):  # llama.cpp's convert_hf_to_gguf permutation of q/k rows
        return t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    r = lambda *s: (torch.randn(*s) * 0.1).numpy()  # noqa: E731
    tensors = {"token_embd.weight": r(V, D), "output_norm.weight": np.ones(D, np.float32), "output.weight": r(V, D),
               "blk.0.attn_norm.weight": np.ones(D, np.float32), "blk.0.ffn_norm.weight": np.ones(D, np.float32),
               "blk.0.attn_q.weight": permute(r(D, D), H), "blk.0.attn_k.weight": permute(r(D // H * KV, D), KV),
               "blk.0.attn_v.weight": r(D // H * KV, D), "blk.0.attn_output.weight": r(D, D),
               "blk.0.ffn_gate.weight": r(F, D), "blk.0.ffn_up.weight": r(F, D), "blk.0.ffn_down.weight": r(D, F)}
    for name, t in tensors.items():
        if bad_type and name == "blk.0.ffn_down.weight":
            w.add_tensor(name, np.zeros(t.shape, np.int32), raw_dtype=gguf.GGMLQuantizationType.I32)
        else:
            w.add_tensor(name, t.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_tensors_streamed_as_transformers_reads_them(tmp_path):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    ref, _ = load_checkpoint(path, tokenizer=False, lazy=False)
    lz, _ = load_checkpoint(path, tokenizer=False)
    ck = lz._circle_fx_checkpoint
    for name, p in ref.named_parameters():  # q/k permutation undone as transformers' GGUF load does
        assert torch.equal(ck.weights.read(ck.names[name]), p.detach()), name


@pytest.mark.slow
def test_gguf_streamed_export_is_the_in_memory_export(tmp_path):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    ref, _ = load_checkpoint(path, tokenizer=False, lazy=False)
    lz, _ = load_checkpoint(path, tokenizer=False)
    _same_bytes(ref, lz, "q4_0")


def _saved(tmp_path, max_shard_size=None):
    d = str(tmp_path / "ckpt")
    tiny("llama").save_pretrained(d, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return d


def _refused(tmp_path, capsys, ckpt, *words):
    out = str(tmp_path / "pkg")
    assert main(["export-llm", ckpt, "-o", out, "--max-seq-len", "16", "--prefill-len", "4", "--quantize", "q4_0"]) != 0
    err = capsys.readouterr().err
    assert not os.path.exists(out)  # nothing written, not even the directory
    assert "Traceback" not in err and all(w in err for w in words), err
    assert len([line for line in err.splitlines() if line.strip()]) <= 3, err


def test_missing_shard(tmp_path, capsys):
    d = _saved(tmp_path, "20KB")
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
    shard = sorted(set(index.values()))[1]
    os.unlink(os.path.join(d, shard))
    _refused(tmp_path, capsys, d, shard, "missing shard", next(k for k, v in index.items() if v == shard))


def test_truncated_safetensors(tmp_path, capsys):
    d = _saved(tmp_path)
    f = os.path.join(d, "model.safetensors")
    header = json.loads(open(f, "rb").read(8 + struct.unpack("<Q", open(f, "rb").read(8))[0])[8:])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    os.truncate(f, os.path.getsize(f) - 100)
    _refused(tmp_path, capsys, d, "model.safetensors", "truncated", last)


def test_gguf_tensor_of_a_type_circle_fx_cannot_read(tmp_path, capsys):
    path = _tiny_gguf(tmp_path / "bad.gguf", bad_type=True)
    _refused(tmp_path, capsys, path, "bad.gguf", "blk.0.ffn_down.weight", "I32")


@pytest.mark.parametrize("change, words", [
    ({"intermediate_size": 48}, ["model.layers.0.mlp.gate_proj.weight", "shape", "[48, 32]"]),
    ({"num_hidden_layers": 3}, ["model.layers.2.", "does not have"]),
])
def test_config_that_does_not_match_the_weights(tmp_path, capsys, change, words):
    d = _saved(tmp_path)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.update(change)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    _refused(tmp_path, capsys, d, "config and weights do not match", *words)


def test_lazy_ops_are_deferred_and_read_when_asked():
    t = torch.arange(6.0).reshape(2, 3)
    calls = []
    lt = lazy.LazyTensor((2, 3), torch.float32, lambda: (calls.append(1), t.clone())[1], "x")
    y = (lt.t() + 1).contiguous()  # what a fold of a transposed weight does
    assert isinstance(y, lazy.LazyTensor) and calls == [] and tuple(y.shape) == (3, 2)
    assert torch.equal(lazy.materialize(y), t.t() + 1) and calls == [1]
    lazy.READS.clear()
    assert bool((lt == 0).any())  # a question about the values reads them, and is recorded
    assert [shape for _, shape in lazy.READS] == [()]
    with pytest.raises(InputError, match="x: read"):
        lazy.LazyTensor((4,), torch.float32, lambda: t, "x").materialize()


def test_streamed_float_weights_are_stored_once_in_model_circle(tmp_path, monkeypatch):
    """Every lazy constant streamed by the writer (threshold 0, as a big model's are): the two entry
    points reach each checkpoint tensor through different ops (prefill's CONV_2D filter, decode's FC
    weight), and model.circle must still hold it once: as many bytes as the in-memory export's file
    (a streamed weight is deduplicated by the digest of its bytes, an in-memory one by its bytes, so
    the buffer order may differ, not the size)."""
    import circle_fx.emit.context as context

    d = str(tmp_path / "llama")
    tiny("llama").save_pretrained(d)
    ref, _ = load_checkpoint(d, tokenizer=False, lazy=False)
    lz, _ = load_checkpoint(d, tokenizer=False)
    a = _export(ref, None)
    monkeypatch.setattr(context, "_LAZY_MIN_BYTES", 0)
    b = _export(lz, None)
    assert len(b.model.to_bytes()) == len(a.model.to_bytes())
    assert len(b.model.to_bytes()) < len(b.decode.to_bytes()) + len(b.prefill.to_bytes()) - 40_000
