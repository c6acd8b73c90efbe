"""onert form limits as legalization steps (emit/legalize/forms.py, types.py, outputs.py).

For each limit: the lowering emits the plain Circle form (the operators as they reach the
legalization stage), the step of that name rewrites it, ``verify`` reports a file legalized by
every step but that one naming the limit, and the exported (legalized) file runs in onert and
matches eager.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.circle.schema import BO, TT, op_name, type_name
from circle_fx.emit import emitter
from circle_fx.emit.legalize import STEPS
from circle_fx.emit.writer import serialize

from onert_eager import Fn, assert_onert_matches_eager, randn


@pytest.fixture
def lowered(monkeypatch):
    """Records the ModelBuilder as the lowerings left it (before legalization) at each export."""
    seen = {}
    real = emitter.legalize

    def spy(mb, protected, **kw):
        seen["mb"], seen["protected"] = copy.deepcopy(mb), set(protected)
        return real(mb, protected, **kw)

    monkeypatch.setattr(emitter, "legalize", spy)
    return seen


def _plain(seen, code):
    """The operators of ``code`` the lowerings emitted, with their input tensors' infos."""
    mb = seen["mb"]
    return [(op, [mb.tensors[t] if t >= 0 else None for t in op.inputs]) for op in mb.operators if op.code == code]


def _verify_without(seen, step_name: str) -> list[str]:
    """verify's problems with the file every legalization step but ``step_name`` made."""
    mb, protected = copy.deepcopy(seen["mb"]), set(seen["protected"])
    names = [s.name for s in STEPS]
    assert step_name in names, names
    for step in STEPS:
        if step.name != step_name:
            step.run(mb, protected)
    with pytest.raises(circle_fx.VerifyError) as info:
        circle_fx.verify(bytes(serialize(mb).head))
    return info.value.problems


def test_constant_lhs(lowered):
    a = randn(6, 5, seed=1)
    module = Fn(lambda x: a @ x)
    x = randn(2, 5, 7)
    cm = assert_onert_matches_eager(module, (x,), rtol=1e-5, atol=1e-5)
    (op, ins), = _plain(lowered, BO.BATCH_MATMUL)
    assert ins[0].buffer and not ins[1].buffer  # plain: the constant on the left
    problems = _verify_without(lowered, "constant_lhs")
    assert any("BATCH_MATMUL" in p and "constant_lhs: a constant lhs" in p for p in problems), problems
    assert "TRANSPOSE" in {op.name for op in _ops(cm)}  # (B^T A^T)^T; the peephole took one TRANSPOSE


def test_constant_lhs_vector_keeps_no_transpose(lowered):
    a = randn(6, 5, seed=1)
    cm = assert_onert_matches_eager(Fn(lambda v: a @ v), (randn(5),), rtol=1e-5, atol=1e-5)
    assert "TRANSPOSE" not in {op.name for op in _ops(cm)}  # a swap of a size-1 dim is a RESHAPE


def test_constant_vector_lhs(lowered):
    v = randn(5, seed=2)
    cm = assert_onert_matches_eager(Fn(lambda x: v @ x), (randn(3, 5, 7),), rtol=1e-5, atol=1e-5)
    assert [op.name for op in _ops(cm)].count("TRANSPOSE") <= 1


def test_dynamic_rms_norm(lowered):
    module = torch.nn.RMSNorm(8, eps=1e-5).eval()
    x = randn(1, 5, 8)
    cm = assert_onert_matches_eager(module, (x,), rtol=1e-5, atol=1e-5,
                                    dynamic_shapes=({1: torch.export.Dim("s", min=2, max=32)},))
    (op, ins), = _plain(lowered, BO.RMS_NORM)
    assert ins[0].shape_signature is not None and -1 in ins[0].shape_signature
    problems = _verify_without(lowered, "dynamic_rms_norm")
    assert any("RMS_NORM" in p and "dynamic_rms_norm: a dynamic input" in p for p in problems), problems
    assert "RMS_NORM" not in {op.name for op in _ops(cm)}
    longer = randn(1, 11, 8, seed=3)
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(longer)[0], module(longer).numpy(), rtol=1e-5, atol=1e-5)


class _Rope(torch.nn.Module):
    """``circle.rope`` with tables of several positions (the fusion never makes one: it is exact
    for one position only; a hand-written graph or a future fusion may)."""

    def __init__(self, positions: int, d: int):
        super().__init__()
        ang = torch.arange(positions)[:, None] * torch.rand(d // 2, generator=torch.Generator().manual_seed(4))
        ang = torch.cat([ang, ang], -1)[None, None]
        self.register_buffer("sin", ang.sin())
        self.register_buffer("cos", ang.cos())

    def forward(self, x):
        from circle_fx.fusions.rope import rope
        return rope(x, self.sin, self.cos)


def test_rope_positions(lowered):
    x = randn(1, 2, 3, 8)
    cm = assert_onert_matches_eager(_Rope(3, 8), (x,), rtol=1e-5, atol=1e-5)
    (op, ins), = _plain(lowered, BO.ROPE)
    assert list(ins[1].shape) == [1, 1, 3, 8]  # plain: the tables as they are
    problems = _verify_without(lowered, "rope_positions")
    assert any("ROPE" in p and "rope_positions: sin table [1, 1, 3, 8] holds several positions" in p
               for p in problems), problems
    assert "ROPE" not in {op.name for op in _ops(cm)}


def test_rope_of_one_position_stays_rope(lowered):
    cm = assert_onert_matches_eager(_Rope(1, 8), (randn(1, 2, 1, 8),), rtol=1e-5, atol=1e-5)
    assert "ROPE" in {op.name for op in _ops(cm)}


@pytest.mark.parametrize("table", [[8], [1, 8], [1, 1, 1, 8], [3, 8], [1, 1, 3, 8], [2, 1, 1, 8]])
def test_rope_fusion_and_limit_agree_on_one_position(table):
    """The RoPE fusion creates ROPE only where the ``rope_positions`` limit holds (one test,
    ``limits.holds_several_positions``), so no fused ROPE is decomposed again."""
    from circle_fx.circle import limits
    from circle_fx.circle.op_table import Operand
    from circle_fx.fusions.rope import _check_one_position

    x = torch.empty(1, 2, 1, 8)
    t = torch.empty(*table)
    fx = _check_one_position({"x": x, "sin": t, "cos": t})  # (fx_utils.val: a value stands for its node)
    ops = [Operand([1, 2, 1, 8], "FLOAT32", False)] + [Operand(table, "FLOAT32", True)] * 2
    assert (fx is None) == (limits.several_positions("ROPE", ops, []) is None), (fx, table)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_select_v2_values_float_only(lowered, dtype):
    ids = torch.arange(8).reshape(2, 4)
    fn = (lambda i: torch.where(i > 2, i, i * 2)) if dtype == torch.int64 else \
        (lambda i: torch.where(i > 2, i > 4, i > 0))
    cm = assert_onert_matches_eager(Fn(fn), (ids,), rtol=0, atol=0)
    (op, ins), = _plain(lowered, BO.SELECT_V2)
    want = TT.INT64 if dtype == torch.int64 else TT.BOOL
    assert ins[1].type == want and ins[2].type == want  # plain: SELECT_V2 of any values
    problems = _verify_without(lowered, "types")
    assert any(f"input type {'INT64' if dtype == torch.int64 else 'BOOL'}: onert 0.1.0's SELECT_V2 runs FLOAT32 only"
               in p for p in problems), problems
    assert "SELECT_V2" not in {op.name for op in _ops(cm)}


@pytest.mark.parametrize("table", ["bool", "int64_constant"])
def test_gather_table_types(lowered, table):
    """onert's GATHER gathers float32 / int32 tables only: the index lowering emits a plain GATHER
    of a bool table (a mask) or of an int64 constant table (a hash table), and the ``types`` step
    carries it: CAST through int32, or the constant stored as int32 and the result CAST back."""
    ids = torch.tensor([[3, 0, 2, 2]])
    if table == "bool":
        fn = lambda m, i: m[0][i]  # noqa: E731
        args = (torch.tensor([[True, False, True, False, True]]), ids)
    else:
        hashed = torch.tensor([7, 1, 2**31 - 5, 4, 0])
        fn = lambda i: hashed[i] * 1  # noqa: E731
        args = (ids,)
    cm = assert_onert_matches_eager(Fn(fn), args, rtol=0, atol=0)
    (op, ins), = _plain(lowered, BO.GATHER)
    assert ins[0].type == (TT.BOOL if table == "bool" else TT.INT64)  # plain: GATHER of the table's type
    problems = _verify_without(lowered, "types")
    want = "BOOL" if table == "bool" else "INT64"
    assert any(f"input type {want}: onert 0.1.0's GATHER runs" in p for p in problems), problems
    from circle_fx.circle.reader import read_circle
    model = read_circle(bytes(cm.to_bytes()))
    gather, = [o for o in model.operators if o.name == "GATHER"]
    assert model.tensors[gather.inputs[0]].type == TT.INT32


def test_int64_transpose_of_size1_dims(lowered):
    """XLNet's ``input_ids.transpose(0, 1)`` on batch 1: the lowering emits a plain int64
    TRANSPOSE (onert: "Transpose: unsupported data type"), verify reports it without the ``types``
    step, which makes it the RESHAPE it is (only a size-1 dim moves)."""
    ids = torch.randint(0, 2**40, (1, 8), generator=torch.Generator().manual_seed(2))
    cm = assert_onert_matches_eager(Fn(lambda i: i.transpose(0, 1) * 3), (ids,), rtol=0, atol=0)
    (op, ins), = _plain(lowered, BO.TRANSPOSE)
    assert ins[0].type == TT.INT64
    problems = _verify_without(lowered, "types")
    assert any("input type INT64: onert 0.1.0's TRANSPOSE runs" in p for p in problems), problems
    assert "TRANSPOSE" not in cm.op_histogram()


def test_integer_pad_of_a_prefix_sum(lowered):
    """``cumsum`` of integers is a prefix sum whose shifts pad with zeros: the lowering emits a
    plain int32 PAD (onert: "Pad: unsupported data type"), verify reports it without the
    ``types`` step, which makes it a CONCATENATION with a zeros block."""
    ids = torch.arange(16, dtype=torch.int32).reshape(2, 8) % 5 - 2
    cm = assert_onert_matches_eager(Fn(lambda i: i.cumsum(1, dtype=torch.int32)), (ids,), rtol=0, atol=0)
    plain = _plain(lowered, BO.PAD)
    assert plain and all(ins[0].type == TT.INT32 for _, ins in plain)
    problems = _verify_without(lowered, "types")
    assert any("input type INT32: onert 0.1.0's PAD runs" in p for p in problems), problems
    assert "PAD" not in cm.op_histogram() and "CONCATENATION" in cm.op_histogram()


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_tile_float_only(lowered, dtype):
    """A dynamic ``expand`` lowers to TILE (BROADCAST_TO needs the whole output shape); onert's
    TILE runs float only, so the ``types`` step broadcasts an integer / bool one against zeros."""
    ids = torch.arange(10, dtype=torch.int32).reshape(2, 1, 5)
    fn = (lambda i: i.expand(2, 3, -1) * 2) if dtype == torch.int32 else (lambda i: (i > 4).expand(2, 3, -1))
    cm = assert_onert_matches_eager(Fn(fn), (ids,), rtol=0, atol=0,
                                    dynamic_shapes=(({2: torch.export.Dim("s", min=2, max=32)},),))
    (op, ins), = _plain(lowered, BO.TILE)
    assert ins[0].type == (TT.INT32 if dtype == torch.int32 else TT.BOOL)  # plain: TILE of any type
    problems = _verify_without(lowered, "types")
    name = "INT32" if dtype == torch.int32 else "BOOL"
    assert any(f"input type {name}: onert 0.1.0's TILE runs FLOAT32 only" in p for p in problems), problems
    assert "TILE" not in {op.name for op in _ops(cm)}
    longer = torch.arange(22, dtype=torch.int32).reshape(2, 1, 11)
    np.testing.assert_array_equal(cm.run(longer)[0], fn(longer).numpy())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_square_float_only(dtype, tmp_path):
    """No lowering emits SQUARE (``square`` and ``pow(x, 2)`` are MUL x x), so the plain form is
    built by hand: an integer SQUARE, which onert refuses at prepare, is reported by verify and
    legalized by the ``types`` step to MUL x x, which onert runs exactly (beyond 2**31 for int64)."""
    import onert

    from circle_fx.emit.builder import ModelBuilder
    from circle_fx.emit.legalize import types as types_step

    mb = ModelBuilder()
    ct = TT.INT32 if dtype == np.int32 else TT.INT64
    x = mb.add_tensor("x", [2, 4], ct)
    out = mb.add_tensor("out", [2, 4], ct)
    mb.add_operator(BO.SQUARE, [x], [out])
    mb.inputs, mb.input_names, mb.outputs, mb.output_names = [x], ["x"], [out], ["out"]
    with pytest.raises(circle_fx.VerifyError) as info:
        circle_fx.verify(bytes(serialize(mb).head))
    name = "INT32" if dtype == np.int32 else "INT64"
    assert any(f"input type {name}: onert 0.1.0's SQUARE runs FLOAT32 only" in p for p in info.value.problems), \
        info.value.problems
    assert types_step.legalize(mb) == 1
    assert [op_name(op.code) for op in mb.operators] == ["MUL"]
    data = bytes(serialize(mb).head)
    circle_fx.verify(data)
    path = tmp_path / "square.circle"
    path.write_bytes(data)
    a = (np.arange(8).reshape(2, 4) - 3).astype(dtype) * (3 * 10**6 if dtype == np.int64 else 1000)
    got, = onert.infer.session(str(path)).infer([a])
    np.testing.assert_array_equal(got, a * a)


@pytest.mark.parametrize("op", ["or", "and"])
def test_logical_broadcast_rank(lowered, op):
    """onert 0.1.0's LOGICAL_OR / LOGICAL_AND with a broadcasting operand return wrong booleans,
    without an error, at rank 5-6 (docs/probes/logical_broadcast.py): the lowering emits the
    rank-5 operator, verify reports it without the ``ranks`` step, which folds it to rank <= 4."""
    a = torch.rand(2, 3, 4, 5, 6, generator=torch.Generator().manual_seed(5)) > 0.5
    b = torch.rand(1, 3, 1, 5, 6, generator=torch.Generator().manual_seed(6)) > 0.5
    fn = (lambda x, y: x | y) if op == "or" else (lambda x, y: x & y)
    cm = assert_onert_matches_eager(Fn(fn), (a, b), rtol=0, atol=0)
    code, name = (BO.LOGICAL_OR, "LOGICAL_OR") if op == "or" else (BO.LOGICAL_AND, "LOGICAL_AND")
    (plain, ins), = _plain(lowered, code)
    assert sorted(len(t.shape) for t in ins) == [5, 5]  # plain: the op at the rank torch wrote it
    problems = _verify_without(lowered, "ranks")
    assert any(f"{name} with broadcasting operands correctly up to rank 4" in p for p in problems), problems
    circle_fx.verify(bytes(cm.to_bytes()))
    from circle_fx.circle.reader import read_circle
    model = read_circle(bytes(cm.to_bytes()))
    folded = [o for o in model.operators if o.name == name]
    assert folded and all(len(model.tensors[o.outputs[0]].shape) <= 4 for o in folded)


def test_logical_broadcast_that_cannot_fold_is_refused():
    """Broadcasts alternating at every position do not merge into 4 dims: an export error naming
    the operator, not a file that computes wrong booleans."""
    a = torch.zeros(2, 1, 3, 1, 4, dtype=torch.bool)
    b = torch.zeros(1, 3, 1, 2, 1, dtype=torch.bool)
    with pytest.raises(circle_fx.UnsupportedOpError, match="5-D LOGICAL_OR .* correctly up to rank 4"):
        circle_fx.export(Fn(lambda x, y: x | y), (a, b))


def test_rank5_bool_expand_is_not_a_broadcasting_logical_or():
    """A bool ``expand`` is LOGICAL_OR with a False constant up to rank 4; at rank 5 that OR
    would be wrong in onert (alternating broadcasts do not fold), so it is a BROADCAST_TO, which
    the ``types`` step carries through int32 (exact)."""
    m = torch.rand(2, 1, 3, 1, 4, generator=torch.Generator().manual_seed(7)) > 0.5
    cm = assert_onert_matches_eager(Fn(lambda k: k.expand(2, 5, 3, 6, 4)), (m,), rtol=0, atol=0)
    assert "LOGICAL_OR" not in cm.op_histogram() and cm.op_histogram()["BROADCAST_TO"] == 1


def test_ggml_rows(lowered):
    model = torch.nn.Linear(64, 32).eval()
    x = randn(2, 3, 64)
    cm = circle_fx.export(model, (x,), quantize="q4_0")
    (op, ins), = _plain(lowered, BO.FULLY_CONNECTED)
    assert list(ins[0].shape) == [2, 3, 64]  # plain: the FC flattens its input itself
    problems = _verify_without(lowered, "ggml_rows")
    assert any("ggml_rows: a GGML-weight FULLY_CONNECTED input of shape [2, 3, 64]" in p for p in problems), problems
    fc = next(o for o in _ops(cm) if o.name == "FULLY_CONNECTED")
    assert len(cm_tensor_shape(cm, fc.inputs[0])) == 2
    if not ggml_unsupported_reason():
        with torch.no_grad():
            ref = model(x).numpy()
        assert np.abs(cm.run(x)[0] - ref).max() / np.abs(ref).max() < 0.05  # q4_0 weights


def test_index_clamps(lowered):
    """onert's GATHER reads outside the table for an id out of range, without an error: the
    embedding lowering emits a plain GATHER of the input ids, the ``index_clamps`` step clamps
    them; without it ``check`` refuses the operators (the step's ``ensures``) and ``verify`` warns
    about a file that neither clamps nor declares the input's ``index_range``."""
    import warnings

    from circle_fx.emit.legalize import check

    emb = torch.nn.Embedding(10, 4).eval()
    ids = torch.tensor([[1, 9, 0]])
    cm = assert_onert_matches_eager(emb, (ids,), rtol=0, atol=0)
    mb = lowered["mb"]
    (op, ins), = _plain(lowered, BO.GATHER)
    assert op.inputs[1] in mb.inputs  # plain: the ids as they come
    with pytest.raises(circle_fx.LegalizeError, match="index_clamps: indices from graph input .* unclamped"):
        check(copy.deepcopy(mb), "index_clamps", {"index_clamps"})
    unclamped = copy.deepcopy(mb)
    protected = set(lowered["protected"])
    for step in STEPS:
        if step.name != "index_clamps":
            step.run(unclamped, protected)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = circle_fx.verify(bytes(serialize(unclamped).head))
    assert report.unclamped_indices and any("10-row table unclamped" in str(w.message) for w in seen), seen
    assert not circle_fx.verify(bytes(cm.to_bytes())).unclamped_indices
    unclamped_file = circle_fx.export(emb, (ids,), clamp_indices=False)  # declares index_range instead
    assert not circle_fx.verify(bytes(unclamped_file.to_bytes())).unclamped_indices


@pytest.mark.parametrize("bias", [True, False])
def test_ggml_bias(lowered, bias):
    """onert's ggml FULLY_CONNECTED throws on a bias and ignores a fused activation: the lowering
    emits the FC with both, verify reports the bias without the ``ggml_bias`` step, which moves
    them into an ADD (of zeros without a bias) after a bare FC."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 32, bias=bias)

        def forward(self, x):
            return torch.relu(self.fc(x))

    model, x = Net().eval(), randn(3, 64)
    cm = circle_fx.export(model, (x,), quantize="q4_0")
    (op, ins), = _plain(lowered, BO.FULLY_CONNECTED)
    assert (ins[2] is not None) == bias and op.options.fusedActivationFunction == 1  # plain: bias, RELU on the FC
    if bias:
        problems = _verify_without(lowered, "ggml_bias")
        assert any("ggml_bias: a bias with a GGML_Q4_0 weight" in p for p in problems), problems
    ops = _ops(cm)
    fc = next(o for o in ops if o.name == "FULLY_CONNECTED")
    assert len(fc.inputs) < 3 or fc.inputs[2] == -1
    assert [o.name for o in ops][-1] == "ADD"
    if not ggml_unsupported_reason():
        with torch.no_grad():
            ref = model(x).numpy()
        assert np.abs(cm.run(x)[0] - ref).max() / np.abs(ref).max() < 0.1  # q4_0 weights


def test_ggml_gather_ids(lowered):
    """onert's GATHER from a GGML_Q4_0 table takes 1-D int32 ids only (int64 fails, [B, T] fills
    only the first row): the embedding lowering emits the plain GATHER of ``[2, 3]`` int64 ids,
    verify reports it without the ``ggml_gather_ids`` step, which CASTs and flattens them. The
    q4_0 GATHER runs on x86 too (only the GGML FC kernels need AVX-512)."""
    from circle_fx.api import lower
    from circle_fx.quant.config import QuantConfig

    emb = torch.nn.Embedding(64, 32).eval()
    ids = torch.tensor([[1, 5, 63], [7, 0, 2]])
    cm = lower(circle_fx.capture(emb, (ids,)), quantize=QuantConfig(weights="q4_0", embedding="q4_0"))
    (op, ins), = _plain(lowered, BO.GATHER)
    assert type_name(ins[0].type) == "GGML_Q4_0" and ins[1].type == TT.INT64 and list(ins[1].shape) == [2, 3]
    problems = _verify_without(lowered, "ggml_gather_ids")
    assert any("ggml_gather_ids: INT64 indices of shape [2, 3]" in p for p in problems), problems
    from circle_fx.circle.reader import read_circle
    model = read_circle(bytes(cm.to_bytes()))
    gather, = [o for o in model.operators if o.name == "GATHER"]
    assert model.tensors[gather.inputs[1]].type == TT.INT32 and len(model.tensors[gather.inputs[1]].shape) == 1
    from circle_fx.circle.ggml_support import ggml_unsupported_reason

    if ggml_unsupported_reason():  # circle_fx refuses to run any GGML file on such a CPU (onert would SIGILL)
        pytest.skip(f"the file's form is checked above; running it: {ggml_unsupported_reason()}")
    with torch.no_grad():
        ref = emb(ids).numpy()
    got = cm.run(ids)[0]
    assert got.shape == ref.shape and np.abs(got - ref).max() / np.abs(ref).max() < 0.15  # q4_0 rows
    assert np.abs(got[1]).max() > 0  # the second row of ids is filled too


def test_output_copies(lowered):
    def fn(x):
        y = x + 1
        return y, y * 2 * 3

    cm = assert_onert_matches_eager(Fn(fn), (randn(2, 8),), rtol=1e-6, atol=1e-6)
    mb = lowered["mb"]
    assert any(mb.outputs[0] in op.inputs for op in mb.operators)  # plain: the output is read on
    problems = _verify_without(lowered, "output_copies")
    assert any("graph output" in p and "output_copies: also read by operator" in p for p in problems), problems


def _ops(cm):
    from circle_fx.circle.reader import read_circle
    return read_circle(bytes(cm.to_bytes())).operators


def cm_tensor_shape(cm, t):
    from circle_fx.circle.reader import read_circle
    return list(read_circle(bytes(cm.to_bytes())).tensors[t].shape)


def test_every_form_limit_has_its_step():
    """The op table's form limits and the legalization steps: one step per limit, named after it."""
    from circle_fx.circle import op_table
    limits = {name for row in op_table.OPS.values() for name, _ in row.forms}
    steps = {s.name: s for s in STEPS}
    assert limits and limits <= set(steps), limits - set(steps)
    assert all(name in steps[name].ensures for name in limits)
    assert op_name(BO.ROPE) == "ROPE"
