"""Every registered built-in lowering runs in onert at least once, against torch eager.

``CASES`` maps each registry target to a tiny module and inputs that make torch.export
produce that op; the test records which lowerings the emitter actually called, so a case
that gets decomposed or folded away before emission fails instead of passing vacuously.
``test_table_covers_the_registry`` makes a new lowering without a case fail CI.
"""
from __future__ import annotations

import operator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

import circle_fx
from circle_fx.emit.emitter import emit
from circle_fx.emit.registry import LOWERINGS, builtin_targets
from circle_fx.quant.lowerings import static
from circle_fx.fusions.rms_norm import rms_norm
from circle_fx.fusions.rope import rope
from circle_fx.fusions.silu import silu
from circle_fx.fusions.linear_activation import linear_act
from circle_fx.dialect.attention import cached_attention
from circle_fx.dialect.nhwc import avg_pool2d_nhwc, conv2d_nhwc, max_pool2d_nhwc
from circle_fx.dialect.weights import conv2d_w8, embedding_ggml, embedding_w8, linear_ggml, linear_w8
from circle_fx.source import op_name

circle_fx.load_compiler()  # builtin_targets sees only what is registered; import circle_fx is lazy

from onert_eager import Fn, assert_onert_matches_eager

aten = torch.ops.aten


def r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ints(*shape, high=5, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


class WithConst(torch.nn.Module):
    """``fn(x, c)`` with ``c`` a constant (a buffer, folded into the Circle file)."""

    def __init__(self, fn, const):
        super().__init__()
        self.fn = fn
        self.register_buffer("c", const)

    def forward(self, *xs):
        return self.fn(*xs, self.c)


class Lin(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3, bias=bias)

    def forward(self, x):
        return self.lin(x)


class LinearAct(torch.nn.Module):
    """``circle.linear_act`` (a linear with a fused ReLU6, the ``linear_activation`` family)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        with torch.no_grad():
            self.lin.weight.mul_(8)

    def forward(self, x):
        return linear_act(x, self.lin.weight, self.lin.bias, "relu6")


class W8Linear(torch.nn.Module):
    """``circle.linear_w8`` with int8 weights [3, 4], per-row scales and a bias."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.tensor([[1, -2, 127, 0], [-127, 5, 9, 3], [64, 64, -64, 1]], dtype=torch.int8))
        self.register_buffer("s", torch.tensor([0.01, 0.002, 0.03]))
        self.register_buffer("b", torch.tensor([0.5, -1.0, 0.25]))

    def forward(self, x):
        return linear_w8(x, self.w, self.s, self.b)


class W8Conv(torch.nn.Module):
    """``circle.conv2d_w8``: an int8 3x3 weight [4, 3, 3, 3] with per-channel scales, a bias, an
    NHWC input padded by 1 and a fused ReLU."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (4, 3, 3, 3), generator=torch.Generator().manual_seed(0),
                                                dtype=torch.int8))
        self.register_buffer("s", torch.tensor([0.01, 0.002, 0.03, 0.5]))
        self.register_buffer("b", torch.tensor([0.5, -1.0, 0.25, 0.0]))

    def forward(self, x):
        return conv2d_w8(x, self.w, self.s, self.b, [1, 1], [1, 1, 1, 1], [1, 1], 1, "relu")


def _w8_conv_input() -> torch.Tensor:
    """Integers spanning exactly [-128, 127]: onert's hybrid convolution quantizes its input
    asymmetrically over [min, max] in 255 steps, so these are quantized exactly (scale 1); a
    symmetric [-127, 127] input, exact for the hybrid FC, is not (measured: 0.5 % off)."""
    x = torch.randint(-128, 128, (1, 5, 5, 3), generator=torch.Generator().manual_seed(1)).float()
    x[0, 0, 0, 0], x[0, 0, 0, 1] = 127.0, -128.0
    return x


class W8Embedding(torch.nn.Module):
    """``circle.embedding_w8``: a uint8 table [10, 4] (zero point 128) with per-row scales."""

    def __init__(self):
        super().__init__()
        self.register_buffer("t", torch.randint(0, 256, (10, 4), dtype=torch.uint8,
                                                generator=torch.Generator().manual_seed(0)))
        self.register_buffer("s", torch.linspace(0.01, 0.1, 10))

    def forward(self, ids):
        return embedding_w8(self.t, self.s, 128, ids)


class GgmlLinear(torch.nn.Module):
    """``circle.linear_ggml``: a Q8_0 weight [3, 64] (ggml byte layout) and a bias."""

    def __init__(self):
        super().__init__()
        from circle_fx.circle.ggml import Q8_0
        from circle_fx.quant.ggml import pack

        self.register_buffer("w", pack(torch.randn(3, 64, generator=torch.Generator().manual_seed(0)), Q8_0)[0])
        self.register_buffer("b", torch.tensor([0.5, -1.0, 0.25]))

    def forward(self, x):
        return linear_ggml(x, self.w, "q8_0", self.b)


class GgmlEmbedding(torch.nn.Module):
    """``circle.embedding_ggml``: a Q4_0 table [10, 32]."""

    def __init__(self):
        super().__init__()
        from circle_fx.circle.ggml import Q4_0
        from circle_fx.quant.ggml import pack

        self.register_buffer("t", pack(torch.randn(10, 32, generator=torch.Generator().manual_seed(0)), Q4_0)[0])

    def forward(self, ids):
        return embedding_ggml(self.t, "q4_0", ids)


X = r(2, 3, 4)
POS = r(2, 3, 4).abs() + 0.5
A, B = r(2, 4, seed=1), r(2, 4, seed=2)
#: exact halves and near-halves of both signs: rounding ops must agree bit for bit
HALVES = torch.tensor([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.49, 0.51], [3.7, -3.7, 1e7 + 1, -7.0, 7.0, 0.0, 99.5, -99.5]])
BOOL_A, BOOL_B = r(2, 4, seed=3) > 0, r(2, 4, seed=4) > 0

#: target -> (module, inputs). One small case per target; tolerances are float32 noise.
CASES = {
    aten.add.Tensor: (Fn(lambda a, b: a + b), (A, B)),
    aten.add.Scalar: (Fn(lambda a: torch.ops.aten.add.Scalar(a, 2.5)), (A,)),
    aten.sub.Tensor: (Fn(lambda a, b: a - b), (A, B)),
    aten.sub.Scalar: (Fn(lambda a: torch.ops.aten.sub.Scalar(a, 1.5)), (A,)),
    aten.mul.Tensor: (Fn(lambda a, b: a * b), (A, B)),
    aten.mul.Scalar: (Fn(lambda a: torch.ops.aten.mul.Scalar(a, 3.0)), (A,)),
    aten.div.Tensor: (Fn(lambda a, b: a / b), (A, B.abs() + 1)),
    aten.div.Scalar: (Fn(lambda a: torch.ops.aten.div.Scalar(a, 4.0)), (A,)),
    aten.rsub.Tensor: (Fn(lambda a, b: torch.rsub(a, b)), (A, B)),
    aten.rsub.Scalar: (Fn(lambda a: 1 - a), (A,)),
    aten.maximum.default: (Fn(torch.maximum), (A, B)),
    aten.minimum.default: (Fn(torch.minimum), (A, B)),
    aten.pow.Tensor_Tensor: (Fn(torch.pow), (POS[0], A[:1].expand(3, 4).abs())),
    aten.pow.Tensor_Scalar: (Fn(lambda x: x ** 3), (A,)),
    aten.neg.default: (Fn(torch.neg), (A,)),
    aten.exp.default: (Fn(torch.exp), (A,)),
    aten.log.default: (Fn(torch.log), (POS,)),
    aten.sqrt.default: (Fn(torch.sqrt), (POS,)),
    aten.rsqrt.default: (Fn(torch.rsqrt), (POS,)),
    aten.reciprocal.default: (Fn(torch.reciprocal), (POS,)),
    aten.square.default: (Fn(torch.square), (ints(2, 4, high=9).to(torch.int32) - 4,)),  # float: canonicalized to pow
    aten.abs.default: (Fn(torch.abs), (A,)),
    aten.floor.default: (Fn(torch.floor), (HALVES,)),
    aten.ceil.default: (Fn(torch.ceil), (HALVES,)),
    aten.round.default: (Fn(torch.round), (HALVES,)),  # half to even, as torch
    aten.trunc.default: (Fn(torch.trunc), (HALVES,)),
    aten.sin.default: (Fn(torch.sin), (A,)),
    aten.cos.default: (Fn(torch.cos), (A,)),
    aten.tanh.default: (Fn(torch.tanh), (A,)),
    aten.sigmoid.default: (Fn(torch.sigmoid), (A,)),
    aten.relu.default: (Fn(torch.relu), (A,)),
    aten.silu.default: (Fn(F.silu), (A,)),
    aten.gelu.default: (Fn(F.gelu), (A,)),
    aten.leaky_relu.default: (Fn(lambda x: F.leaky_relu(x, 0.2)), (A,)),
    aten.eq.Tensor: (Fn(lambda a, b: a == b), (ints(2, 4), ints(2, 4, seed=1))),
    aten.eq.Scalar: (Fn(lambda a: a == 2), (ints(2, 4),)),
    aten.ne.Tensor: (Fn(lambda a, b: a != b), (ints(2, 4), ints(2, 4, seed=1))),
    aten.ne.Scalar: (Fn(lambda a: a != 2), (ints(2, 4),)),
    aten.lt.Tensor: (Fn(lambda a, b: a < b), (A, B)),
    aten.lt.Scalar: (Fn(lambda a: a < 0.1), (A,)),
    aten.le.Tensor: (Fn(lambda a, b: a <= b), (A, B)),
    aten.le.Scalar: (Fn(lambda a: a <= 0.1), (A,)),
    aten.gt.Tensor: (Fn(lambda a, b: a > b), (A, B)),
    aten.gt.Scalar: (Fn(lambda a: a > 0.1), (A,)),
    aten.ge.Tensor: (Fn(lambda a, b: a >= b), (A, B)),
    aten.ge.Scalar: (Fn(lambda a: a >= 0.1), (A,)),
    aten.logical_and.default: (Fn(torch.logical_and), (BOOL_A, BOOL_B)),
    aten.logical_or.default: (Fn(torch.logical_or), (BOOL_A, BOOL_B)),
    aten.logical_not.default: (Fn(torch.logical_not), (BOOL_A,)),
    aten.bitwise_and.Tensor: (Fn(torch.bitwise_and), (BOOL_A, BOOL_B)),
    aten.bitwise_or.Tensor: (Fn(torch.bitwise_or), (BOOL_A, BOOL_B)),
    aten.bitwise_not.default: (Fn(torch.bitwise_not), (BOOL_A,)),
    aten.__and__.Tensor: (Fn(lambda a, b: torch.ops.aten.__and__.Tensor(a, b)), (BOOL_A, BOOL_B)),
    aten.__or__.Tensor: (Fn(lambda a, b: torch.ops.aten.__or__.Tensor(a, b)), (BOOL_A, BOOL_B)),
    aten.where.self: (Fn(torch.where), (BOOL_A, A, B)),
    aten.where.ScalarSelf: (Fn(lambda c, b: torch.where(c, 1.0, b)), (BOOL_A, B)),
    aten.where.ScalarOther: (Fn(lambda c, a: torch.where(c, a, 0.0)), (BOOL_A, A)),
    aten.where.Scalar: (Fn(lambda c: torch.ops.aten.where.Scalar(c, 1.0, -1.0)), (BOOL_A,)),
    aten.clamp.default: (Fn(lambda x: x.clamp(-0.5, 0.5)), (A,)),
    aten.clamp.Tensor: (Fn(lambda x, lo, hi: x.clamp(lo, hi)), (A, B - 1, B + 1)),
    aten.clamp_min.default: (Fn(lambda x: x.clamp_min(0.2)), (A,)),
    aten.clamp_max.default: (Fn(lambda x: x.clamp_max(0.2)), (A,)),
    aten._to_copy.default: (Fn(lambda x: torch.ops.aten._to_copy.default(x, dtype=torch.int32) * 2), (A * 4,)),
    aten.to.dtype: (Fn(lambda x: torch.ops.aten.to.dtype(x, torch.int32) * 2), (A * 4,)),
    aten.to.dtype_layout: (Fn(lambda x: torch.ops.aten.to.dtype_layout(x, dtype=torch.int32) * 2), (A * 4,)),
    aten.to.device: (Fn(lambda x: torch.ops.aten.to.device(x, torch.device("cpu"), torch.int32) * 2), (A * 4,)),
    aten.type_as.default: (Fn(lambda x, i: x.type_as(i) + i), (A * 4, ints(2, 4))),
    aten.view.default: (Fn(lambda x: x.view(6, 4)), (X,)),
    aten.reshape.default: (Fn(lambda x: x.reshape(3, 8)), (X,)),
    aten._unsafe_view.default: (Fn(lambda x: torch.ops.aten._unsafe_view.default(x, [4, 6])), (X,)),
    aten.unsqueeze.default: (Fn(lambda x: x.unsqueeze(1)), (X,)),
    aten.squeeze.dim: (Fn(lambda x: x.squeeze(1)), (r(2, 1, 4),)),
    aten.squeeze.dims: (Fn(lambda x: x.squeeze((0, 2))), (r(1, 3, 1),)),
    aten.squeeze.default: (Fn(lambda x: x.squeeze()), (r(1, 3, 1),)),
    aten.flatten.using_ints: (Fn(lambda x: x.flatten(1)), (X,)),
    aten.unflatten.int: (Fn(lambda x: x.unflatten(-1, (2, 2))), (X,)),
    aten.transpose.int: (Fn(lambda x: x.transpose(0, 2)), (X,)),
    aten.permute.default: (Fn(lambda x: x.permute(1, 2, 0)), (X,)),
    aten.t.default: (Fn(lambda x: x.t()), (A,)),
    aten.numpy_T.default: (Fn(lambda x: torch.ops.aten.numpy_T.default(x)), (X,)),
    aten.expand.default: (Fn(lambda x: x.expand(2, 3, 4)), (r(1, 3, 1),)),
    aten.expand_as.default: (Fn(lambda x, y: x.expand_as(y)), (r(1, 3, 1), X)),
    aten.broadcast_to.default: (Fn(lambda x: torch.broadcast_to(x, (2, 3, 4))), (r(3, 1),)),
    aten.slice.Tensor: (Fn(lambda x: x[:, 1:3]), (X,)),
    aten.select.int: (Fn(lambda x: x[:, -1]), (X,)),
    aten.cat.default: (Fn(lambda a, b: torch.cat([a, b], 1)), (A, B)),
    aten.concat.default: (Fn(lambda a, b: torch.concat([a, b], 0)), (A, B)),
    aten.split.Tensor: (Fn(lambda x: tuple(t * 2 for t in x.split(2, -1))), (X,)),
    aten.split_with_sizes.default: (Fn(lambda x: tuple(t * 2 for t in x.split([1, 3], -1))), (X,)),
    aten.chunk.default: (Fn(lambda x: tuple(t * 2 for t in torch.ops.aten.chunk.default(x, 2, -1))), (X,)),
    operator.getitem: (Fn(lambda x: x.split([1, 3], -1)[1] * 2), (X,)),
    aten.mean.dim: (Fn(lambda x: x.mean(-1)), (X,)),
    aten.mean.default: (Fn(lambda x: x.mean()), (X,)),
    aten.sum.dim_IntList: (Fn(lambda x: x.sum(1, keepdim=True)), (X,)),
    aten.sum.default: (Fn(lambda x: x.sum()), (X,)),
    aten.amax.default: (Fn(lambda x: x.amax(-1)), (X,)),
    aten.max.dim: (Fn(lambda x: tuple(x.max(-1))), (X,)),
    aten.min.dim: (Fn(lambda x: tuple(x.min(-1))), (X,)),
    aten.topk.default: (Fn(lambda x: tuple(torch.topk(x, 2))), (X,)),
    aten._softmax.default: (Fn(lambda x: torch.ops.aten._softmax.default(x, -1, False)), (X,)),
    aten.softmax.int: (Fn(lambda x: torch.softmax(x, -1)), (X,)),
    aten._log_softmax.default: (Fn(lambda x: torch.ops.aten._log_softmax.default(x, -1, False)), (X,)),
    aten.log_softmax.int: (Fn(lambda x: torch.log_softmax(x, -1)), (X,)),
    aten.linear.default: (Lin(), (X,)),
    linear_act: (LinearAct(), (X,)),
    aten.matmul.default: (Fn(torch.matmul), (X, r(4, 5))),
    aten.bmm.default: (Fn(torch.bmm), (X, r(2, 4, 5))),
    aten.mm.default: (Fn(torch.mm), (A, r(4, 5))),
    aten.embedding.default: (torch.nn.Embedding(6, 4), (ints(2, 3),)),
    aten.index_select.default: (Fn(lambda x, i: x.index_select(1, i)), (X, torch.tensor([2, 0]))),
    aten.index.Tensor: (WithConst(lambda i, w: w[i], r(5, 4)), (ints(3),)),
    aten.repeat_interleave.self_int: (Fn(lambda x: x.repeat_interleave(2, dim=1)), (X,)),
    aten.constant_pad_nd.default: (Fn(lambda x: (F.pad(x, (1, 2, 0, 1)), F.pad(x, (2, 0), value=-1.5))), (X,)),
    aten.scaled_dot_product_attention.default: (Fn(F.scaled_dot_product_attention),
                                                (r(1, 2, 3, 4), r(1, 2, 3, 4, seed=1), r(1, 2, 3, 4, seed=2))),
    rms_norm: (torch.nn.RMSNorm(4, eps=1e-6), (X,)),
    aten.cumsum.default: (Fn(lambda x: x.cumsum(1)), (X,)),
    aten.new_ones.default: (Fn(lambda x: x + x.new_ones((4,))), (X,)),
    aten.new_zeros.default: (Fn(lambda x: x + x.new_zeros((4,))), (X,)),
    aten.new_full.default: (Fn(lambda x: x + x.new_full((4,), 2.5)), (X,)),
    rope: (Fn(rope), (r(1, 2, 1, 8), r(1, 1, 8, seed=1), r(1, 1, 8, seed=2))),  # one position; 3-D tables reshaped
    silu: (Fn(silu), (A * 3,)),  # the silu family's own lowering (TANH form)
    # int8 weights (onert's hybrid FC quantizes each input row to int8: rows of integers whose
    # largest magnitude is 127 are quantized exactly, so the comparison stays at float noise)
    linear_w8: (W8Linear(), (torch.tensor([[[127., -3, 5, 0], [-127, 64, 1, 2], [7, 127, -9, 3]]] * 2),)),
    embedding_w8: (W8Embedding(), (ints(2, 3, high=10),)),
    conv2d_w8: (W8Conv(), (_w8_conv_input(),)),
    # NCHW convolutions and pools become these channels-last ops (more forms: test_conv_pool.py)
    conv2d_nhwc: (torch.nn.Conv2d(3, 4, 3, padding=1), (r(1, 3, 6, 6),)),
    max_pool2d_nhwc: (torch.nn.MaxPool2d(3, 2, 1), (r(1, 2, 7, 7),)),
    avg_pool2d_nhwc: (torch.nn.AvgPool2d(3, 2, 1), (r(1, 2, 7, 7),)),
    # a decode step's grouped attention over the first 6 rows of a 9-row cache (a bucket; rows 4, 5 masked)
    # + one new row, V^T cache
    cached_attention: (Fn(lambda q, kp, kn, vt, vn, pos: cached_attention(
        q, kp, kn, vt, vn, (torch.tensor([0, 1, 2, 3, 4, 5, -1]) < pos).view(1, 1, 1, 7), 0.35, True, 6)),
        (r(1, 4, 1, 8, seed=5), r(1, 2, 9, 8, seed=6), r(1, 2, 1, 8, seed=7), r(1, 2, 8, 9, seed=8),
         r(1, 2, 1, 8, seed=9), torch.tensor([4]))),
}

#: GGML block weights: onert runs them only on CPUs its ggml build supports (AVX-512); elsewhere
#: run() must refuse cleanly. Integer activations whose every 32-block has |max| 127 get the
#: block scale 1 in ggml's Q8 dot product, so they are quantized exactly and the comparison stays
#: at float noise. Indices [2, 3]: onert's GGML GATHER reads only the first row of 2-D indices.
def _q8_exact_rows(rows: int, cols: int) -> torch.Tensor:
    x = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) % 201 - 100
    x[:, ::32] = 127.0
    return x


GGML_CASES = {
    linear_ggml: (GgmlLinear(), (_q8_exact_rows(2, 64),)),
    embedding_ggml: (GgmlEmbedding(), (ints(2, 3, high=10),)),
}

#: targets that only appear in a graph exported with dynamic shapes: target -> (module, inputs, dynamic_shapes)
DYNAMIC_CASES = {
    aten.sym_size.int: (Fn(lambda x: x.reshape(x.shape[0], 2, 2)), (r(3, 4),),
                        (({0: torch.export.Dim("n", min=2, max=8)},),)),
    # prefix sums over a run-time length (emit/lowerings/scan.py)
    aten.arange.default: (Fn(lambda x: x * torch.arange(x.shape[0])[:, None]), (r(5, 4),),
                          (({0: torch.export.Dim("n", min=2, max=8)},),)),
    aten.arange.start: (Fn(lambda x: x * torch.arange(3, x.shape[0] + 3)[:, None]), (r(5, 4),),
                        (({0: torch.export.Dim("n", min=2, max=8)},),)),
    operator.add: (Fn(lambda x: x * torch.arange(3, x.shape[0] + 3)[:, None]), (r(5, 4),),
                   (({0: torch.export.Dim("n", min=2, max=8)},),)),
    operator.mul: (Fn(lambda x: x.reshape(x.shape[0] * 2, 2)), (r(5, 4),),
                   (({0: torch.export.Dim("n", min=2, max=8)},),)),
    aten.diff.default: (Fn(lambda x: torch.diff(x, dim=0, prepend=x[:1])), (r(5, 4),),
                        (({0: torch.export.Dim("n", min=2, max=8)},),)),
}


@contextmanager
def recording():
    """Replace every lowering with a wrapper that notes its target when called."""
    called = set()
    saved = dict(LOWERINGS)

    def wrap(target, fn):
        def recorded(ctx, node):
            called.add(target)
            return fn(ctx, node)
        return recorded

    for t, fn in saved.items():
        LOWERINGS[t] = wrap(t, fn)
    try:
        yield called
    finally:
        LOWERINGS.clear()
        LOWERINGS.update(saved)


def _id(t):
    return op_name(t)


@pytest.mark.parametrize("target", list(CASES), ids=_id)
def test_lowering_runs_in_onert(target):
    module, inputs = CASES[target]
    torch.manual_seed(0)
    with recording() as called:
        assert_onert_matches_eager(module, inputs, rtol=1e-5, atol=1e-5)
    assert target in called, f"{op_name(target)} was not lowered (called: {sorted(map(op_name, called))})"


@pytest.mark.parametrize("target", list(GGML_CASES), ids=_id)
def test_ggml_lowering_runs_in_onert_or_refuses(target):
    from circle_fx.circle.ggml_support import ggml_unsupported_reason

    module, inputs = GGML_CASES[target]
    with recording() as called:
        if ggml_unsupported_reason():
            cm = circle_fx.export(module, inputs)
            with pytest.raises(circle_fx.RuntimeFailure, match="GGML"):
                cm.run(*inputs)
        else:
            assert_onert_matches_eager(module, inputs, rtol=1e-4, atol=1e-4)
    assert target in called


@pytest.mark.parametrize("target", list(DYNAMIC_CASES), ids=_id)
def test_dynamic_only_lowering_runs_in_onert(target):
    module, inputs, dynamic_shapes = DYNAMIC_CASES[target]
    with recording() as called:
        assert_onert_matches_eager(module, inputs, rtol=1e-5, atol=1e-5, dynamic_shapes=dynamic_shapes)
    assert target in called


@pytest.mark.parametrize("target", [aten.clone.default, aten.contiguous.default, aten.alias.default])
def test_emit_takes_only_canonicalized_programs(target):
    """No-ops (torch.export drops them, Canonicalize in every pipeline removes any left) have no
    lowering: ``emit`` names one left in its input instead of copying the tensor in onert."""
    program = circle_fx.capture(Fn(lambda x: -x + 1), (A,))
    neg = next(n for n in program.gm.graph.nodes if n.target is aten.neg.default)
    neg.target, neg.args = target, (neg.args[0],)
    program.gm.recompile()
    with pytest.raises(circle_fx.PassError, match=f"canonicalized.*%{neg.name} \\({op_name(target)}\\)"):
        emit(program)


def test_table_covers_the_registry():
    """A new built-in lowering needs a case here (and a case needs a lowering)."""
    table = set(CASES) | set(DYNAMIC_CASES) | set(GGML_CASES)
    # the static-quantization lowerings take uint8 model inputs, which break onert's infer():
    # they run end to end through PT2E-quantized models (tests/quant/test_pt2e_*.py)
    builtin = builtin_targets() - {t for t, fn in LOWERINGS.items() if fn.__module__ == static.__name__}
    assert not builtin - table, f"lowerings without a case: {sorted(map(op_name, builtin - table))}"
    assert not table - builtin, f"cases without a lowering: {sorted(map(op_name, table - builtin))}"
