"""Dynamic shapes: a symbolic batch or sequence dim becomes -1 in ``shape_signature`` and
the one Circle model runs in onert at several sizes, matching eager at each.

Where a model cannot be lowered with a dynamic dim, the error says which op and why.
(A transformers decoder with a dynamic sequence length and only input_ids: see
test_dynamic_seq_llm.py; here, the variant with mask and position ids as inputs.)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import circle_fx
from circle_fx import UnsupportedOpError
from circle_fx.circle.reader import read_circle

from rms_cases import NormModule, Spelling

ATOL = 1e-5


def hand_written_rms(d, seed=0):
    """``weight * (x * rsqrt(mean(x**2) + 1e-6))``, the hand-written spelling that must fuse."""
    return NormModule(Spelling(weight="before"), d, seed=seed)


class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=32, d_out=4):
        super().__init__()
        self.up = nn.Linear(d_in, hidden)
        self.down = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class AttentionFreeLM(nn.Module):
    """Embedding -> (RMSNorm -> gated MLP -> residual) x 2 -> RMSNorm -> LM head."""

    def __init__(self, vocab=48, d=32, hidden=64, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norms = nn.ModuleList(hand_written_rms(d, seed=i) for i in range(layers))
        self.gate = nn.ModuleList(nn.Linear(d, hidden, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(d, hidden, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(hidden, d, bias=False) for _ in range(layers))
        self.final = hand_written_rms(d, seed=layers)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for norm, g, u, dn in zip(self.norms, self.gate, self.up, self.down):
            x = norm(h)
            h = h + dn(F.silu(g(x)) * u(x))
        return self.head(self.final(h))


class MixingBlock(nn.Module):
    """Shape ops on a dynamic sequence: head split (RESHAPE with -1), TRANSPOSE, token mixing
    with BATCH_MATMUL + SOFTMAX, slices, CONCATENATION, reductions."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = 1, x.shape[1], x.shape[2]
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1)
        y = (p @ v).transpose(1, 2).reshape(b, s, d)
        y = self.out(y) + x
        head, tail = y[:, :1], y[:, 1:]
        y = torch.cat([tail, head], dim=1)  # rotate tokens
        return y, y.mean(-1, keepdim=True), y[..., :3].amax(-1)


class Attention(nn.Module):
    """Grouped-query self-attention through F.scaled_dot_product_attention."""

    def __init__(self, d=16, heads=4, kv_heads=2, causal=False):
        super().__init__()
        self.h, self.kvh, self.hd, self.causal = heads, kv_heads, d // heads, causal
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, kv_heads * self.hd)
        self.v = nn.Linear(d, kv_heads * self.hd)
        self.o = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, n, self.kvh, self.hd).transpose(1, 2)
        v = self.v(x).view(b, n, self.kvh, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, n, self.h * self.hd))


def signature(cm, which):
    cf = read_circle(cm.to_bytes())
    idx = cf.inputs if which == "inputs" else cf.outputs
    return [cf.tensors[i].shape_signature for i in idx]


def check_sizes(cm, model, make_inputs, sizes):
    model.eval()
    for size in sizes:
        inputs = make_inputs(size)
        with torch.no_grad():
            ref = model(*inputs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = cm.run(*inputs)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.shape == tuple(r.shape), (size, g.shape, r.shape)
            np.testing.assert_allclose(g, r.numpy(), rtol=1e-4, atol=ATOL * max(1.0, float(r.abs().max())))


# ---------------------------------------------------------------------------- works
def test_mlp_dynamic_batch():
    torch.manual_seed(0)
    model = MLP().eval()
    cm = circle_fx.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch", max=64)},))
    assert signature(cm, "inputs") == [[-1, 8]]
    assert signature(cm, "outputs") == [[-1, 4]]
    check_sizes(cm, model, lambda n: (torch.randn(n, 8),), [3, 17, 1])


def test_mlp_dynamic_seq_3d():
    torch.manual_seed(0)
    model = MLP().eval()
    cm = circle_fx.export(model, (torch.randn(2, 5, 8),), dynamic_shapes=({1: Dim("seq", max=128)},))
    assert signature(cm, "inputs") == [[2, -1, 8]]
    assert signature(cm, "outputs") == [[2, -1, 4]]
    check_sizes(cm, model, lambda n: (torch.randn(2, n, 8),), [3, 9])


def test_mlp_dynamic_batch_and_seq():
    """Two dynamic leading dims: FULLY_CONNECTED's flatten could not be undone by one RESHAPE,
    so the linear becomes a BATCH_MATMUL with the transposed weight."""
    torch.manual_seed(0)
    model = MLP().eval()
    cm = circle_fx.export(model, (torch.randn(2, 5, 8),),
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=64)},))
    assert signature(cm, "inputs") == [[-1, -1, 8]]
    assert cm.op_histogram()["BATCH_MATMUL"] == 2
    check_sizes(cm, model, lambda n: (torch.randn(n % 3 + 1, n, 8),), [4, 7])


def test_rmsnorm_dynamic_seq_is_decomposed():
    torch.manual_seed(0)
    model = hand_written_rms(16).eval()
    x = torch.randn(1, 5, 16)
    static = circle_fx.export(model, (x,))
    assert static.op_histogram()["RMS_NORM"] == 1
    cm = circle_fx.export(model, (x,), dynamic_shapes=({1: Dim("seq", max=128)},))
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 0  # onert's RMS_NORM cannot be resized
    assert hist["MEAN"] == 1 and hist["RSQRT"] == 1
    assert signature(cm, "outputs") == [[1, -1, 16]]
    check_sizes(cm, model, lambda n: (torch.randn(1, n, 16),), [3, 12, 1])


def test_attention_free_lm_dynamic_seq():
    torch.manual_seed(0)
    model = AttentionFreeLM().eval()
    ids = torch.randint(0, 48, (1, 6))
    cm = circle_fx.export(model, (ids,), dynamic_shapes=({1: Dim("seq", max=256)},))
    assert signature(cm, "inputs") == [[1, -1]]
    assert signature(cm, "outputs") == [[1, -1, 48]]
    assert len(cm.report.fusions) == 3  # the norms were still recognised
    gen = torch.Generator().manual_seed(1)
    check_sizes(cm, model, lambda n: (torch.randint(0, 48, (1, n), generator=gen),), [3, 20])


def test_shape_ops_dynamic_seq():
    torch.manual_seed(0)
    model = MixingBlock().eval()
    cm = circle_fx.export(model, (torch.randn(1, 5, 8),), dynamic_shapes=({1: Dim("seq", min=3, max=64)},))
    hist = cm.op_histogram()
    for op in ("TRANSPOSE", "BATCH_MATMUL", "SOFTMAX", "STRIDED_SLICE", "CONCATENATION", "MEAN"):
        assert hist[op] >= 1, (op, dict(hist))
    assert all(-1 in s for s in signature(cm, "outputs"))
    check_sizes(cm, model, lambda n: (torch.randn(1, n, 8),), [3, 11])


def test_gqa_attention_dynamic_seq():
    torch.manual_seed(0)
    model = Attention().eval()
    cm = circle_fx.export(model, (torch.randn(1, 5, 16),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    hist = cm.op_histogram()
    assert hist["GATHER"] == 2 and hist["BATCH_MATMUL"] == 2 and hist["SOFTMAX"] == 1  # kv heads repeated
    check_sizes(cm, model, lambda n: (torch.randn(1, n, 16),), [3, 13])


def test_attention_with_a_mask_input_dynamic_seq():
    """The way to get causal attention with a dynamic length: the mask is a model input."""
    torch.manual_seed(0)
    model = Attention().eval()
    seq = Dim("seq", min=2, max=64)
    mask = torch.zeros(1, 1, 5, 5)
    cm = circle_fx.export(model, (torch.randn(1, 5, 16), mask), dynamic_shapes=({1: seq}, {2: seq, 3: seq}))
    assert signature(cm, "inputs") == [[1, -1, 16], [1, 1, -1, -1]]

    def inputs(n):
        causal = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)[None, None]
        return torch.randn(1, n, 16), causal

    check_sizes(cm, model, inputs, [3, 10])


def test_causal_attention_with_dynamic_seq():
    """is_causal=True: the mask is built on device from prefix-sum positions (no RANGE)."""
    torch.manual_seed(0)
    model = Attention(causal=True).eval()
    cm = circle_fx.export(model, (torch.randn(1, 5, 16),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    assert cm.op_histogram()["LESS_EQUAL"] == 1
    check_sizes(cm, model, lambda n: (torch.randn(1, n, 16),), [3, 13, 64])


def test_causal_attention_with_unbounded_dynamic_seq_is_a_clear_error():
    with pytest.raises(UnsupportedOpError) as info:
        circle_fx.export(Attention(causal=True).eval(), (torch.randn(1, 5, 16),),
                         dynamic_shapes=({1: Dim("seq", min=2)},))
    msg = str(info.value)
    assert "is_causal=True attention over dim 1 of input 'x'" in msg and "no upper bound" in msg
    assert "test_dynamic_shapes.py" in msg


def test_saved_dynamic_model_runs_from_file(tmp_path):
    from circle_fx.circle.runtime import OnertSession

    torch.manual_seed(0)
    model = MLP().eval()
    cm = circle_fx.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch", max=64)},))
    path = cm.save(tmp_path / "mlp.circle")
    sess = OnertSession(path)
    for n in (2, 6):
        x = torch.randn(n, 8)
        (got,) = sess.run([x.numpy()])
        np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-4, atol=ATOL)


# ------------------------------------------------------------------- clear errors
class ExpandToSeq(nn.Module):
    def forward(self, x):
        return x + torch.ones(1, 1, 8).expand(1, x.shape[1], 8)


def test_op_without_dynamic_support_names_itself():
    with pytest.raises(UnsupportedOpError) as info:
        circle_fx.export(ExpandToSeq(), (torch.randn(1, 5, 8),), dynamic_shapes=({1: Dim("seq", max=64)},))
    msg = str(info.value)
    assert "aten.expand.default" in msg and "expanding dim 1 from 1 to -1" in msg and "run time" in msg
    assert "test_dynamic_shapes.py" in msg  # the source line


class FourDynamicDims(nn.Module):
    def forward(self, x):
        return (x * 2).reshape(x.shape[0], x.shape[1], 2, 4)


def test_violated_dynamic_constraint_is_explained():
    """``y[:, 1:]`` needs seq != 2 (torch guards on it): the message quotes torch's constraint."""
    with pytest.raises(circle_fx.CaptureError) as info:
        circle_fx.export(MixingBlock(), (torch.randn(1, 5, 8),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    msg = str(info.value)
    assert "Constraints violated (seq)" in msg and "Not all values of seq" in msg
    assert "hint: a dimension marked dynamic" in msg
    assert len(msg.splitlines()) <= 6


def test_reshape_with_two_dynamic_dims_is_a_clear_error():
    with pytest.raises(UnsupportedOpError, match="more than one dynamic dim"):
        circle_fx.export(FourDynamicDims(), (torch.randn(2, 5, 8),),
                         dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=64)},))


def causal_mask(n: int) -> torch.Tensor:
    return torch.triu(torch.full((n, n), float("-inf")), diagonal=1)[None, None]


def test_tiny_llama_dynamic_seq_with_mask_and_positions_as_inputs(tiny_llama):
    """Given the 4-D causal mask and the position ids as inputs, transformers builds nothing
    from the length, and the unpatched Llama runs at any length from one Circle model
    (repeat_kv's expand becomes TILE; RMSNorm is decomposed)."""
    model, (ids,) = tiny_llama
    seq = Dim("seq", min=2, max=64)
    n = ids.shape[1]
    cm = circle_fx.export(model, (ids,),
                          example_kwargs={"attention_mask": causal_mask(n), "position_ids": torch.arange(n)[None]},
                          dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {2: seq, 3: seq},
                                          "position_ids": {1: seq}})
    assert signature(cm, "inputs") == [[1, -1], [1, 1, -1, -1], [1, -1]]
    assert signature(cm, "outputs") == [[1, -1, model.config.vocab_size]]
    gen = torch.Generator().manual_seed(3)
    for m in (3, 13):
        x = torch.randint(0, model.config.vocab_size, (1, m), generator=gen)
        (got,) = cm.run(x, causal_mask(m), torch.arange(m)[None])
        with torch.no_grad():
            want = model(input_ids=x).logits.numpy()  # the model's own mask: the same logits
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


# A transformers decoder from input_ids alone (positions and mask built at run time): see
# tests/llm/test_dynamic_seq_llm.py.


class _Clamp(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=-0.5, max=0.5) * 2


def test_clamp_with_dynamic_batch():
    model = _Clamp()
    cm = circle_fx.export(model, (torch.randn(3, 7),), dynamic_shapes=({0: Dim("b", min=2, max=8)},))
    for rows in (3, 6):
        x = torch.randn(rows, 7, generator=torch.Generator().manual_seed(rows))
        assert torch.allclose(torch.as_tensor(cm.run(x)[0]), model(x), rtol=1e-6, atol=1e-6)
