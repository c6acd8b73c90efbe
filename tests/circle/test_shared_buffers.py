"""Each distinct constant is stored once: repeated buffers are shared, verify reports repeats."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.dedup import duplicate_bytes, duplicates
from circle_fx.circle.reader import read_circle
from circle_fx.emit.builder import ModelBuilder

from test_verify import mutate


def test_duplicates_finds_exact_repeats_only():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(10_000).astype(np.float32)
    near = a.copy()
    near[1] += 1.0  # differs at one element the 256-byte sample does not look at
    same_bytes_other_dtype = a.view(np.int32)
    bufs = [None, a, near, a.copy(), np.zeros(0, np.float32), same_bytes_other_dtype, np.zeros(4), np.zeros(4)]
    dups = duplicates(bufs)
    assert dups == {3: 1, 5: 1, 7: 6}
    assert duplicate_bytes(bufs, dups) == 2 * a.nbytes + 32


def test_share_buffers_points_tensors_at_one_buffer():
    mb = ModelBuilder()
    w = np.arange(600, dtype=np.float32).reshape(20, 30)
    t1 = mb.add_constant("table", w)
    t2 = mb.add_constant("filter", w.reshape(20, 1, 1, 30).copy())  # same bytes, another layout
    t3 = mb.add_constant("other", w + 1)
    assert len(mb.buffers) == 4
    assert mb.share_buffers() == w.nbytes
    assert len(mb.buffers) == 3 and mb.shared == (1, w.nbytes)
    assert mb.tensors[t1].buffer == mb.tensors[t2].buffer != mb.tensors[t3].buffer
    assert np.array_equal(mb.buffers[mb.tensors[t3].buffer], w + 1)
    assert mb.share_buffers() == 0


@pytest.fixture(scope="module")
def tied():
    """A tied Llama whose lm_head is a CONV_2D (wide vocabulary): GATHER [V, D] and the
    [V, 1, 1, D] filter are the same bytes; each layer folds its own causal mask and RoPE tables."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16384, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, use_cache=False, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 40))
    return model, ids, circle_fx.export(model, (ids,))


def test_tied_embedding_is_stored_once_and_runs(tied, tmp_path):
    model, ids, cm = tied
    cf = read_circle(cm.save(tmp_path / "tied.circle"))
    table_bytes = model.config.vocab_size * model.config.hidden_size * 4
    big = [b for b in cf.buffers if b.size == table_bytes]
    assert len(big) == 1, f"{len(big)} copies of the embedding table"
    users = [t for t in cf.tensors if t.buffer == big[0].index]
    assert {len(t.shape) for t in users} >= {2, 4}, [t.shape for t in users]  # GATHER table + CONV_2D filter
    assert "CONV_2D" in cm.op_histogram()
    assert cm.builder.shared[1] >= table_bytes
    assert f"{cm.builder.shared[1]:,} bytes saved" in cm.summary()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no repeats left for verify to warn about
        assert circle_fx.verify(tmp_path / "tied.circle").duplicate_buffers == 0
    with torch.no_grad():
        want = model(ids).logits.numpy()
    (got,) = cm.run(ids)
    assert np.abs(got - want).max() < 1e-4
    assert cm.size < table_bytes * 1.5  # was two tables before sharing


def test_verify_reports_repeated_buffers(tied):
    cm = tied[2]

    def repeat_a_buffer(m, sg):
        t = next(t for t in sg.tensors if t.buffer and m.buffers[t.buffer].data is not None
                 and len(m.buffers[t.buffer].data) > 1000)
        copy = type(m.buffers[t.buffer])()
        copy.data = np.array(m.buffers[t.buffer].data, copy=True)
        m.buffers.append(copy)
        t.buffer = len(m.buffers) - 1

    data = mutate(cm.to_bytes(), repeat_a_buffer)
    with pytest.warns(UserWarning, match="repeat another buffer's bytes"):
        report = circle_fx.verify(data)
    assert report.duplicate_buffers == 1 and report.duplicate_bytes > 1000
    assert "could be shared" in str(report)
