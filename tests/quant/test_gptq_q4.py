"""GPTQ inside GGML Q4_0's grid (circle_fx/quant/gptq_q4.py, opt-in) and the q4_0 default on the
built-in corpus when the export has a tokenizer (issue 33 items 1 and 3).

The sweep must land every weight on the grid the packer writes (bit for bit), lower the output
error ``|(W - Q) X|`` below the importance-weighted search on correlated inputs (what GPTQ is
for), and the export must pack its blocks only while the weight is the one calibrated.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx import QuantConfig
from circle_fx.circle.ggml import Q4_0
from circle_fx.quant import activation_importance
from circle_fx.quant.ggml import pack
from circle_fx.quant.gptq_q4 import Rounding, fingerprint, gptq_q4_0

transformers = pytest.importorskip("transformers")


def _dequant(blocks: torch.Tensor, shape) -> np.ndarray:
    rec = blocks.numpy().reshape(shape[0], -1).view(Q4_0.record()).reshape(shape[0], -1)
    q = rec["q"]
    codes = np.concatenate([q & 15, q >> 4], -1).astype(np.float32) - 8
    return (codes * rec["d"].astype(np.float32)[..., None]).reshape(shape)


def _correlated(n=128, rows=2048, seed=0):
    """Inputs with correlated columns and a few loud ones (a trained LLM's residual stream)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n, n, generator=g) / n ** 0.5 + torch.eye(n)
    x = torch.randn(rows, n, generator=g) @ mix
    x[:, [3, 50, 90]] *= 12
    return x


def test_gptq_rounding_lies_on_the_packed_grid_and_beats_the_weighted_search():
    x = _correlated()
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(1))
    h = x.T @ x / x.shape[0]
    q, scales = gptq_q4_0(w, h)
    blocks, _, _ = pack(torch.from_numpy(q), Q4_0, scales=scales)
    np.testing.assert_array_equal(_dequant(blocks, q.shape), q)  # exactly what the file holds
    rtn, _, _ = pack(w, Q4_0, importance=torch.diagonal(h).numpy())
    err_gptq = float((((w - torch.from_numpy(q)) @ x.T) ** 2).sum())
    err_rtn = float((((w - torch.from_numpy(_dequant(rtn, w.shape))) @ x.T) ** 2).sum())
    assert err_gptq < 0.8 * err_rtn, (err_gptq, err_rtn)


def test_rounding_is_used_only_for_the_weight_it_was_computed_from():
    w = torch.randn(64, 64)
    blocks, _, _ = pack(w, Q4_0)
    r = Rounding()
    r.blocks["a.weight"] = (blocks, fingerprint(w))
    r.blocks["b.weight"] = (blocks, fingerprint(w))
    assert r.for_weight("a.weight", w) is blocks
    assert r.for_weight("a.weight", w * 1.01) is None  # a fusion or SmoothQuant changed it
    assert r.for_weight("a.weight+b.weight", torch.cat([w, w])).shape == (128, blocks.shape[1])
    assert r.for_weight("a.weight+c.weight", torch.cat([w, w])) is None  # a member without rounding


def _llama():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_datafree import _llama as llama  # the small Llama with loud input columns

    return llama()


def test_export_packs_gptq_blocks_for_every_q4_0_linear():
    model = _llama()
    g = torch.Generator().manual_seed(3)
    samples = [{"input_ids": torch.randint(0, 256, (1, 64), generator=g), "use_cache": False} for _ in range(4)]
    imp = activation_importance(model, samples, gptq=True)
    ids = torch.randint(0, 256, (1, 16), generator=g)
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False},
                          quantize=QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q8_0", importance=imp))
    record = cm.report.quantization
    q4_linears = [n for n, kind, _, dtype in record.quantized if dtype == "q4_0" and "linear" in kind]
    assert q4_linears and sorted(record.gptq) == sorted(q4_linears) and not record.not_gptq
    assert "rounded by GPTQ" in cm.summary()
    # the merged q/k/v weight holds the members' GPTQ blocks, row for row
    name = next(n for n in record.gptq if "q_proj" in n)
    parts = name.split("+")
    expect = torch.cat([imp.rounding.blocks[p][0] for p in parts])
    assert imp.rounding.for_weight(name, torch.cat([dict(model.named_parameters())[p] for p in parts])) is not None
    assert expect.shape[0] == sum(dict(model.named_parameters())[p].shape[0] for p in parts)


def test_export_llm_default_calibrates_on_the_built_in_corpus_with_a_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    from circle_fx.llm.export import export_llm

    vocab = {chr(c): i for i, c in enumerate(range(32, 32 + 250))}
    vocab["[UNK]"] = 250
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model = _llama()
    pkg = export_llm(model, 32, 8, quantize="q4_0", tokenizer=tok, buckets="off")
    text = pkg.decode.summary()
    assert "built-in corpus (pydoc topics)" in text and "rounded by GPTQ" not in text, text
    pkg_ids = export_llm(model, 32, 8, quantize="q4_0", tokenizer=None, buckets="off")  # no tokenizer: random ids
    assert "seeded random token ids" in pkg_ids.decode.summary()
