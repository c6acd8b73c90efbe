"""The decode step reads its KV cache inputs without copying them (issue 32 item 4):
``circle.cached_attention`` (passes/cached_attention.py) instead of attention over
``cat([cache, new row])``, value caches kept transposed ``[1, H, D, S]`` (manifest version 3),
and the tokens are still transformers' greedy ones."""
from __future__ import annotations

import pytest
import torch

from llm_models import greedy_reference, tiny

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.circle.schema import op_name
from circle_fx.dialect.attention import cached_attention


def _cache_readers(decode, names):
    """{cache input name: [(op name, adjointRhs)]} of the ops that read each cache input."""
    b = decode.builder
    inputs = {t: n for t, n in zip(b.inputs, b.input_names) if n in names}
    out = {n: [] for n in names}
    for op in b.operators:
        for t in op.inputs:
            if t in inputs:
                out[inputs[t]].append((op_name(op.code), getattr(op.options, "adjointRhs", None)))
    return out


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)])
def test_cached_attention_eager_is_sdpa_over_the_concatenation(transposed, heads):
    h, hk = heads
    g = torch.Generator().manual_seed(0)
    q, kp, vp = (torch.randn(s, generator=g) for s in ((1, h, 1, 8), (1, hk, 10, 8), (1, hk, 10, 8)))
    kn, vn = torch.randn(1, hk, 1, 8, generator=g), torch.randn(1, hk, 1, 8, generator=g)
    mask = torch.arange(11).view(1, 1, 1, 11) < 7
    mask[..., -1] = True
    k, v = torch.cat([kp, kn], 2), torch.cat([vp, vn], 2)
    if hk != h:
        k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    got = cached_attention(q, kp, kn, vp.transpose(2, 3).contiguous() if transposed else vp, vn, mask, 0.3, transposed)
    torch.testing.assert_close(got, want)


def test_gqa_decode_reads_the_cache_in_place_and_generates_like_transformers(tmp_path):
    """A GQA Llama (4 query heads, 2 K/V heads), decode buckets 16 and 48 rows: every cache input of the
    full-length step is read only by BATCH_MATMULs with adjointRhs (no CONCATENATION, SELECT_V2, TRANSPOSE
    of a cache), and 40 greedy steps (crossing the 16-row bucket) are transformers' tokens."""
    model = tiny("llama")
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=48, prefill_len=4, tokenizer=None,
                               buckets={"decode": [16], "prefill": "off"})
    m = pkg.manifest
    assert m["version"] == 3 and m["decode"]["buckets"]["lengths"] == [16, 48]
    axis = {s["name"]: s["axis"] for s in m["cache"]["states"]}
    assert axis == {n: 3 if n.startswith("value") else 2 for n in m["cache"]["names"]}
    readers = _cache_readers(pkg.decode, set(m["cache"]["names"]))
    for name, ops in readers.items():
        assert ops and all(op == "BATCH_MATMUL" and adj for op, adj in ops), (name, ops)
    b = pkg.decode.builder  # nor any copy of a cache plus its new row ([1, 2, 49, 8] / [1, 2, 8, 49]) elsewhere
    assert not [op_name(op.code) for op in b.operators for t in op.outputs
                if sorted(b.tensors[t].shape) == [1, 2, 8, 49]]
    pkg.save(tmp_path / "pkg")
    # the 16-row bucket reads the caches' first rows through the op (SLICE), not a STRIDED_SLICE of its own
    bucket = read_circle(str(tmp_path / "pkg" / "model.circle"), subgraph=m["decode"]["buckets"]["subgraphs"][0])
    names = {t for t, n in zip(bucket.inputs, (bucket.tensors[i].name for i in bucket.inputs)) if "cache" in n}
    assert {op_name(op.builtin_code) for op in bucket.operators if names & set(op.inputs)} == {"SLICE"}
    greedy_reference().assert_generates_like_transformers(pkg.runner(), model, ([5, 17, 9], [5, 17, 9, 33, 42]), 40)


@pytest.mark.parametrize("attempt", ["auto", "always"])
def test_eager_attention_keeps_the_plain_value_layout(tmp_path, monkeypatch, attempt):
    """A model whose attention is not SDPA (eager: matmul + softmax + matmul) is not taken by the pass:
    export_llm keeps its value caches [1, H, S, D] (a transposed one would cost a TRANSPOSE per step),
    writes a version-2 manifest, and generates exactly as before. "auto" does not try the transposed
    layout for it; "always" does, and the check after the capture (values_read_in_place) falls back."""
    from circle_fx.llm import export as llm_export

    monkeypatch.setattr(llm_export, "TRANSPOSE_VALUES", attempt)
    layouts, set_layout = [], llm_export._set_value_layout
    monkeypatch.setattr(llm_export, "_set_value_layout",
                        lambda *a, transposed: (layouts.append(transposed), set_layout(*a, transposed=transposed)))
    model = tiny("llama")
    model.config._attn_implementation = "eager"
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, tokenizer=None, buckets="off")
    m = pkg.manifest
    assert m["version"] == 2 and {s["axis"] for s in m["cache"]["states"]} == {2}
    assert layouts == ([] if attempt == "auto" else [True, False])  # "always": tried, then the fallback
    pkg.save(tmp_path / "pkg")
    greedy_reference().assert_generates_like_transformers(pkg.runner(), model, ([5, 17, 9],), 8)
