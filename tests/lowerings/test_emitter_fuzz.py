"""Property test: random graphs of supported ops, exported and run in onert, match eager.

Hypothesis draws a small program — inputs with random shapes, then a chain of
elementwise ops (with broadcasting, scalars and constant tensors), reductions, reshapes,
transposes, softmax, matrix products, comparisons with ``where``, slices and
concatenation — builds an ``nn.Module`` that interprets it,
exports it, runs the Circle file in onert and compares with PyTorch. Values are kept in
a numerically tame range (division by ``|b| + 1``, ``exp`` of non-positive values, ...)
so a mismatch means a lowering bug, not float noise.

Reproducing a failure: the run is derandomized (the same examples every time) and the
failing program is printed (``note``) as Python-like text; ``@reproduce_failure`` blobs
are printed too. For a longer hunt: ``CIRCLE_FX_FUZZ_EXAMPLES=1000 CIRCLE_FX_FUZZ_RANDOM=1``.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from torch import nn

import circle_fx

from onert_eager import assert_onert_matches_eager

MAX_RANK = 4  # onert's BATCH_MATMUL / MEAN / SQUARED_DIFFERENCE limit
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
UNARY = ["neg", "tanh", "sigmoid", "relu", "abs", "exp_neg", "sqrt_abs", "rsqrt_sq1", "square", "silu"]
REDUCE = ["mean", "sum", "amax"]


# ------------------------------------------------------------------ interpreter
def _binary(op, a, b):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / (torch.abs(b) + 1.0) if isinstance(b, torch.Tensor) else a / b
    if op == "maximum":
        return torch.maximum(a, b)
    if op == "minimum":
        return torch.minimum(a, b)
    raise ValueError(op)


def _unary(op, x):
    return {
        "neg": lambda: -x, "tanh": lambda: torch.tanh(x), "sigmoid": lambda: torch.sigmoid(x),
        "relu": lambda: torch.relu(x), "abs": lambda: torch.abs(x), "exp_neg": lambda: torch.exp(-torch.abs(x)),
        "sqrt_abs": lambda: torch.sqrt(torch.abs(x) + 0.1), "rsqrt_sq1": lambda: torch.rsqrt(x * x + 1.0),
        "square": lambda: torch.square(x), "silu": lambda: F.silu(x),
    }[op]()


class Interpreter(nn.Module):
    def __init__(self, n_inputs, steps, consts, outputs):
        super().__init__()
        self.n_inputs, self.steps, self.outputs = n_inputs, steps, outputs
        for name, t in consts.items():
            self.register_buffer(name, t)

    def forward(self, *xs):
        v = list(xs)
        for kind, *a in self.steps:
            if kind == "binary":
                op, i, j = a
                v.append(_binary(op, v[i], v[j]))
            elif kind == "binary_scalar":
                op, i, s, swap = a
                v.append(_binary(op, s, v[i]) if swap and op in ("add", "sub", "mul") else _binary(op, v[i], s))
            elif kind == "binary_const":
                op, i, c, swap = a
                c = getattr(self, c)
                v.append(_binary(op, c, v[i]) if swap else _binary(op, v[i], c))
            elif kind == "unary":
                op, i = a
                v.append(_unary(op, v[i]))
            elif kind == "reduce":
                op, i, dims, keep = a
                fn = {"mean": torch.mean, "sum": torch.sum, "amax": torch.amax}[op]
                v.append(fn(v[i], dim=dims, keepdim=keep))
            elif kind == "reshape":
                i, shape = a
                v.append(v[i].reshape(shape))
            elif kind == "reshape_keep0":  # keeps the (dynamic) leading dim
                i, rest = a
                v.append(v[i].reshape([v[i].shape[0]] + list(rest)))
            elif kind == "permute":
                i, perm = a
                v.append(v[i].permute(perm))
            elif kind == "softmax":
                (i,) = a
                v.append(torch.softmax(v[i], dim=-1))
            elif kind == "linear":
                i, w, b = a
                v.append(F.linear(v[i], getattr(self, w), getattr(self, b) if b else None))
            elif kind == "matmul_const":
                i, w = a
                v.append(v[i] @ getattr(self, w))
            elif kind == "matmul_self":
                (i,) = a
                v.append(v[i] @ v[i].transpose(-1, -2))
            elif kind == "select":  # comparison + where
                cmp, i, j = a
                cond = {"gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le}[cmp](v[i], v[j])
                v.append(torch.where(cond, v[i], v[j] * 0.5))
            elif kind == "slice":
                i, dim, start, end, step = a
                index = [slice(None)] * v[i].dim()
                index[dim] = slice(start, end, step)
                v.append(v[i][tuple(index)])
            elif kind == "cat":
                i, j, dim = a
                v.append(torch.cat([v[i], v[j]], dim=dim))
            else:
                raise ValueError(kind)
        return tuple(v[o] for o in self.outputs)


# -------------------------------------------------------------------- generator
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=MAX_RANK)


def _broadcastable_variant(draw, shape):
    """A shape that broadcasts with ``shape``: some dims set to 1, maybe fewer leading dims."""
    drop = draw(st.integers(0, len(shape) - 1))
    out = list(shape[drop:])
    return [1 if draw(st.booleans()) else d for d in out]


def _factorizations(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _draw_dims(draw, n, rank):
    """``rank`` dims whose product is ``n`` (the last takes what the others leave)."""
    dims = []
    for _ in range(rank - 1):
        d = draw(st.sampled_from(_factorizations(n)))
        dims.append(d)
        n //= d
    return dims + [n]


@st.composite
def programs(draw, dynamic=False):
    """``dynamic``: dim 0 of every input is a dynamic batch dim; steps then keep it in place
    (rank >= 2, never reduced, never moved) so the program stays valid for any batch size."""
    rng_seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(rng_seed)
    base = draw(shapes)
    if dynamic:
        base = [draw(st.integers(2, 4))] + (base[:3] if len(base) > 1 else base)
    n_inputs = draw(st.integers(1, 2))
    if dynamic:
        in_shapes = [base] + [[base[0]] + [1 if draw(st.booleans()) else d for d in base[1:]]
                              for _ in range(n_inputs - 1)]
    else:
        in_shapes = [base] + [_broadcastable_variant(draw, base) for _ in range(n_inputs - 1)]
    vals = [list(s) for s in in_shapes]
    steps, consts, lines = [], {}, []

    def const(shape, name_hint="c", positive=False):
        name = f"{name_hint}{len(consts)}"
        data = rng.standard_normal(shape).astype(np.float32)
        consts[name] = torch.from_numpy(np.abs(data) + 0.5 if positive else data)
        return name

    n_steps = draw(st.integers(1, 7))
    for _ in range(n_steps):
        i = draw(st.integers(0, len(vals) - 1))
        s = vals[i]
        kinds = ["binary", "binary_scalar", "binary_const", "unary", "reduce", "reshape", "softmax", "linear",
                 "select", "slice", "cat"]
        if len(s) >= 2:
            kinds += ["permute", "matmul_self", "matmul_const"]
        if dynamic and len(s) < 3:
            kinds.remove("matmul_self")  # [B, n] @ [n, B] would make two dynamic dims
        kind = draw(st.sampled_from(kinds))
        if kind == "binary":
            partners = [j for j, t in enumerate(vals) if _broadcast(s, t) is not None
                        and (not dynamic or len(t) == len(s))]  # dynamic: align the batch dims
            j = draw(st.sampled_from(partners))
            op = draw(st.sampled_from(BINARY))
            out = _broadcast(s, vals[j])
            if len(out) > MAX_RANK:
                continue
            steps.append(("binary", op, i, j))
            lines.append(f"{op}(v{i}, v{j})")
        elif kind == "binary_scalar":
            op = draw(st.sampled_from(["add", "sub", "mul", "div"]))
            scalar = draw(st.sampled_from([0.5, 2.0, -1.5, 3, 1.0]))
            swap = draw(st.booleans())
            if op == "div" and not swap and scalar == 0:
                continue
            out = list(s)
            steps.append(("binary_scalar", op, i, scalar, swap))
            lines.append(f"{op}({scalar}, v{i})" if swap and op in ("add", "sub", "mul") else f"{op}(v{i}, {scalar})")
        elif kind == "binary_const":
            op = draw(st.sampled_from(BINARY))
            cshape = _broadcastable_variant(draw, s)
            if dynamic and len(cshape) == len(s):
                cshape[0] = 1  # a constant cannot have the dynamic batch size
            swap = draw(st.booleans()) and op != "div"
            name = const(cshape)
            out = list(s)
            steps.append(("binary_const", op, i, name, swap))
            lines.append(f"{op}({name}{cshape}, v{i})" if swap else f"{op}(v{i}, {name}{cshape})")
        elif kind == "unary":
            op = draw(st.sampled_from(UNARY))
            out = list(s)
            steps.append(("unary", op, i))
            lines.append(f"{op}(v{i})")
        elif kind == "reduce":
            op = draw(st.sampled_from(REDUCE))
            lo = 1 if dynamic else 0
            if lo >= len(s):
                continue
            dims = sorted(draw(st.sets(st.integers(lo, len(s) - 1), min_size=1, max_size=len(s) - lo)))
            dims = [d - len(s) if draw(st.booleans()) else d for d in dims]  # negative axes too
            keep = draw(st.booleans()) or (dynamic and len(s) - len(dims) < 2)
            pos = {d % len(s) for d in dims}
            out = [1 if k in pos else d for k, d in enumerate(s)] if keep else [d for k, d in enumerate(s) if k not in pos]
            if not out:  # a 0-d result: onert has no rank-0 support, keep one dim
                keep, out = True, [1] * len(s)
            steps.append(("reduce", op, i, dims, keep))
            lines.append(f"{op}(v{i}, dim={dims}, keepdim={keep})")
        elif kind == "reshape" and dynamic:
            n = math.prod(s[1:])
            rest = _draw_dims(draw, n, draw(st.integers(1, MAX_RANK - 1)))
            out = [s[0]] + rest
            if draw(st.booleans()):
                rest = list(rest)
                rest[draw(st.integers(0, len(rest) - 1))] = -1
            steps.append(("reshape_keep0", i, rest))
            lines.append(f"v{i}.reshape([v{i}.shape[0]] + {rest})")
        elif kind == "reshape":
            n = math.prod(s)
            out = _draw_dims(draw, n, draw(st.integers(1, MAX_RANK)))
            use_minus_one = draw(st.booleans())
            target = list(out)
            if use_minus_one:
                target[draw(st.integers(0, len(target) - 1))] = -1
            steps.append(("reshape", i, target))
            lines.append(f"v{i}.reshape({target})")
        elif kind == "permute":
            perm = draw(st.permutations(list(range(len(s)))))
            if dynamic:
                perm = [0] + list(draw(st.permutations(list(range(1, len(s))))))
            out = [s[p] for p in perm]
            steps.append(("permute", i, list(perm)))
            lines.append(f"v{i}.permute({list(perm)})")
        elif kind == "softmax":
            out = list(s)
            steps.append(("softmax", i))
            lines.append(f"softmax(v{i}, -1)")
        elif kind == "linear":
            n_out = draw(st.integers(1, 5))
            w = const([n_out, s[-1]], "w")
            b = const([n_out], "b") if draw(st.booleans()) else None
            out = list(s[:-1]) + [n_out]
            steps.append(("linear", i, w, b))
            lines.append(f"linear(v{i}, {w}[{n_out},{s[-1]}], {b})")
        elif kind == "matmul_const":
            n_out = draw(st.integers(1, 5))
            w = const([s[-1], n_out], "m")
            out = list(s[:-1]) + [n_out]
            steps.append(("matmul_const", i, w))
            lines.append(f"v{i} @ {w}[{s[-1]},{n_out}]")
        elif kind == "select":
            partners = [j for j, t in enumerate(vals) if _broadcast(s, t) is not None
                        and (not dynamic or len(t) == len(s))]
            j = draw(st.sampled_from(partners))
            cmp = draw(st.sampled_from(["gt", "lt", "ge", "le"]))
            out = _broadcast(s, vals[j])
            steps.append(("select", cmp, i, j))
            lines.append(f"where(v{i} {cmp} v{j}, v{i}, v{j} * 0.5)")
        elif kind == "slice":
            dim = draw(st.integers(1 if dynamic else 0, len(s) - 1)) if len(s) > (1 if dynamic else 0) else None
            if dim is None:
                continue
            size = s[dim]
            start = draw(st.one_of(st.none(), st.integers(-size, size - 1)))
            end = draw(st.one_of(st.none(), st.integers(-size, size)))
            step = draw(st.sampled_from([1, 1, 2]))
            length = len(range(size)[slice(start, end, step)])
            if length == 0:
                continue
            out = list(s)
            out[dim] = length
            steps.append(("slice", i, dim, start, end, step))
            lines.append(f"v{i}[{':, ' * dim}{'' if start is None else start}:{'' if end is None else end}:{step}]")
        elif kind == "cat":
            dim = draw(st.integers(1 if dynamic else 0, len(s) - 1)) if len(s) > (1 if dynamic else 0) else None
            if dim is None:
                continue
            partners = [j for j, t in enumerate(vals)
                        if len(t) == len(s) and all(a == b for k, (a, b) in enumerate(zip(s, t)) if k != dim)]
            j = draw(st.sampled_from(partners))
            out = list(s)
            out[dim] = s[dim] + vals[j][dim]
            steps.append(("cat", i, j, dim))
            lines.append(f"cat([v{i}, v{j}], dim={dim})")
        elif kind == "matmul_self":
            out = list(s[:-1]) + [s[-2]]
            steps.append(("matmul_self", i))
            lines.append(f"v{i} @ v{i}.transpose(-1, -2)")
        lines[-1] = f"v{len(vals)} = {lines[-1]}  # {out}"
        vals.append(out)
    if not steps:
        steps.append(("unary", "tanh", 0))
        lines.append(f"v{len(vals)} = tanh(v0)  # {vals[0]}")
        vals.append(list(vals[0]))
    outputs = [len(vals) - 1]
    computed = list(range(n_inputs, len(vals) - 1))
    if computed and draw(st.booleans()):
        outputs.insert(0, draw(st.sampled_from(computed)))
    text = "\n".join([f"inputs: " + ", ".join(f"v{k}{sh}" for k, sh in enumerate(in_shapes)),
                      f"constants seed: {rng_seed}"] + lines + [f"return {', '.join(f'v{o}' for o in outputs)}"])
    return in_shapes, steps, consts, outputs, text


def _broadcast(a, b):
    try:
        return list(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


# ------------------------------------------------------------------------- test
@settings(max_examples=int(os.environ.get("CIRCLE_FX_FUZZ_EXAMPLES", 150)), deadline=None,
          derandomize=os.environ.get("CIRCLE_FX_FUZZ_RANDOM") != "1", print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_random_graphs_match_eager(program):
    in_shapes, steps, consts, outputs, text = program
    note(text)
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(s, generator=gen) for s in in_shapes)
    model = Interpreter(len(in_shapes), steps, consts, outputs).eval()
    with torch.no_grad():
        ref = [r.numpy() for r in model(*inputs)]
    cm = circle_fx.export(model, inputs)
    got = cm.run(*inputs)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert tuple(g.shape) == tuple(r.shape), f"shape {g.shape} != eager {r.shape}"
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * scale)


def test_generator_covers_every_step_kind():
    """The strategy can produce each kind of step (guards against a silently narrowed search)."""
    seen = set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(programs())
    def collect(program):
        seen.update(step[0] for step in program[1])

    collect()
    assert seen >= {"binary", "binary_scalar", "binary_const", "unary", "reduce", "reshape", "permute",
                    "softmax", "linear", "matmul_const", "matmul_self", "select", "slice", "cat"}, seen


# --------------------------------------------------- regressions found by the fuzzer
class OutputAlsoConsumed(nn.Module):
    """onert 0.1.0 returned ``c``'s value for ``a`` when ``a`` was both an output and read later."""

    def forward(self, x):
        a = torch.tanh(x)
        c = (a + 1.0) * 2.0
        return a, c


class SameOutputTwice(nn.Module):
    def forward(self, x):
        a = x * 3.0
        return a, a


class InputIsOutput(nn.Module):
    def forward(self, x):
        return x, x + 1.0


class ConstantOutputs(nn.Module):
    """A parameter and a folded constant as outputs: no operator produces them, so they get a copy."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 3))

    def forward(self, x):
        return x + 1.0, self.w, self.w * 2.0


class Reduce4D(nn.Module):
    """onert rejects 4-D MEAN/SUM/REDUCE_MAX with keepDims=False on most axes."""

    def forward(self, x):
        return x.mean(0), x.sum([0, 2]), x.amax(1)


class Linear1D(nn.Module):
    """FULLY_CONNECTED needs a 2-D input in onert."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 2)

    def forward(self, x):
        return self.l(x)


@pytest.mark.parametrize("model, shape", [(OutputAlsoConsumed(), (2, 3)), (SameOutputTwice(), (2, 3)),
                                          (InputIsOutput(), (2, 3)), (ConstantOutputs(), (2, 3)),
                                          (Reduce4D(), (2, 3, 4, 5)),
                                          (Linear1D(), (3,))], ids=lambda v: type(v).__name__)
def test_regressions(model, shape):
    assert_onert_matches_eager(model, (torch.randn(shape),), rtol=1e-5, atol=1e-5)


@settings(max_examples=int(os.environ.get("CIRCLE_FX_FUZZ_EXAMPLES", 150)) * 2 // 3, deadline=None,
          derandomize=os.environ.get("CIRCLE_FX_FUZZ_RANDOM") != "1", print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(dynamic=True))
def test_random_graphs_with_dynamic_batch(program):
    """Same, with dim 0 dynamic: one Circle model (-1 in shape_signature) runs at two batch sizes."""
    from torch.export import Dim

    in_shapes, steps, consts, outputs, text = program
    note(text)
    model = Interpreter(len(in_shapes), steps, consts, outputs).eval()
    batch = Dim("batch", min=2, max=32)
    gen = torch.Generator().manual_seed(0)
    example = tuple(torch.randn(s, generator=gen) for s in in_shapes)
    cm = circle_fx.export(model, example, dynamic_shapes=(tuple({0: batch} for _ in in_shapes),))  # forward(*xs)
    from circle_fx.circle.reader import read_circle

    cf = read_circle(cm.to_bytes())
    for i in cf.inputs + cf.outputs:
        assert cf.tensors[i].shape_signature and cf.tensors[i].shape_signature[0] == -1, cf.tensors[i]
    for b in (in_shapes[0][0] + 3, 2):
        inputs = tuple(torch.randn([b] + s[1:], generator=gen) for s in in_shapes)
        with torch.no_grad():
            ref = [r.numpy() for r in model(*inputs)]
        got = cm.run(*inputs)
        for g, r in zip(got, ref):
            assert tuple(g.shape) == tuple(r.shape), f"batch {b}: shape {g.shape} != eager {r.shape}"
            scale = max(1.0, float(np.abs(r).max()))
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * scale)
