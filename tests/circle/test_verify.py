"""circle_fx.verify: accepts what we emit, and catches each kind of corruption.

Corrupted files are made by unpacking a real emitted model with circle_schema's object
API, breaking one thing, and packing it again, so each test shows one check at work.
"""
from __future__ import annotations

import flatbuffers
import numpy as np
import pytest
import torch
from circle_schema import circle
from torch import nn

import circle_fx
from circle_fx import VerifyError
from circle_fx.emit.writer import Serialized
from circle_fx.model import CircleModel

from rms_cases import NormModule, Spelling

BO = circle.BuiltinOperator.BuiltinOperator


class Cover(nn.Module):
    """Emits every op verify has a shape rule for that matters most."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = NormModule(Spelling(weight="before"), 8)  # a hand-written RMSNorm
        self.scale = nn.Parameter(torch.rand(1, 1, 8))

    def forward(self, ids, x):
        h = self.norm(self.lin(self.emb(ids) + x)) * self.scale  # GATHER ADD FC RESHAPE RMS_NORM MUL
        # TRANSPOSE ADD BATCH_MATMUL SOFTMAX (the ADD keeps the TRANSPOSE: BATCH_MATMUL would
        # otherwise read h itself with adjointRhs, see circle_fx/emit/legalize/peephole.py; its
        # other operand is a run-time tensor that is no permute, so layout_nhwc cannot move the
        # transpose past it either)
        p = torch.softmax(h @ (h.transpose(1, 2) + x[:, None, :, 0]), -1)
        c = torch.cat([p, h[:, :, 1:3]], -1)  # STRIDED_SLICE CONCATENATION
        return c.mean(-1), c.sum(1).reshape(-1)  # MEAN SUM RESHAPE


@pytest.fixture(scope="module")
def cover():
    torch.manual_seed(0)
    model = Cover().eval()
    inputs = (torch.randint(0, 10, (2, 3)), torch.randn(2, 3, 8))
    return circle_fx.export(model, inputs), model, inputs


@pytest.fixture(scope="module")
def good(cover):
    return cover[0].to_bytes()


def mutate(data: bytes, fn) -> bytes:
    m = circle.Model.ModelT.InitFromPackedBuf(bytearray(data), 0)  # writable views
    fn(m, m.subgraphs[0])
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"CIR0")
    return bytes(b.Output())


def first_op(m, sg, name):
    code = getattr(BO, name)
    for i, op in enumerate(sg.operators):
        if m.operatorCodes[op.opcodeIndex].builtinCode == code:
            return i, op
    raise AssertionError(f"no {name} operator")


def problems_of(data) -> list[str]:
    with pytest.raises(VerifyError) as info:
        circle_fx.verify(data)
    assert info.value.problems, "VerifyError must list its problems"
    assert str(info.value).count("\n") >= 1
    return info.value.problems


def assert_problem(data, *words):
    problems = problems_of(data)
    assert any(all(w in p for w in words) for p in problems), problems


# ------------------------------------------------------------------------- accepts
def test_emitted_model_verifies_and_reports(good, cover, tmp_path):
    report = circle_fx.verify(good)
    assert isinstance(report, circle_fx.VerifyReport)
    assert report.inputs == ["ids", "x"] and len(report.outputs) == 2
    for op in ("FULLY_CONNECTED", "BATCH_MATMUL", "GATHER", "RMS_NORM", "STRIDED_SLICE", "CONCATENATION"):
        assert report.op_counts[op] >= 1
    assert report.shape_checked == report.operators  # every op here has a rule
    assert "OK" in str(report)
    path = cover[0].save(tmp_path / "m.circle")
    assert circle_fx.verify(path).operators == report.operators
    assert circle_fx.verify(cover[0]).tensors == report.tensors


def test_roundtrip_through_object_api_still_verifies(good):
    circle_fx.verify(mutate(good, lambda m, sg: None))


# ------------------------------------------------------------- export verifies
def _tag_float_as_quantized(program) -> bool:
    """A broken pass: quantization parameters on FLOAT32 tensors (verify rejects them)."""
    from circle_fx.circle.schema import QuantParams
    from circle_fx.meta import QUANT_META

    for n in program.graph.nodes:
        if n.op == "call_function" and "linear" in str(n.target):
            n.meta[QUANT_META] = QuantParams(0.05, 128)
    return False


def _broken_pipeline():
    pipeline = circle_fx.default_pipeline()
    pipeline.append(_tag_float_as_quantized)
    return pipeline


def test_export_verifies_what_it_emits(cover, tmp_path):
    cm, model, inputs = cover
    assert cm.verified and "verify" in cm.report.timings
    with pytest.raises(VerifyError, match="circle_fx bug") as e:
        circle_fx.export(nn.Linear(8, 4).eval(), (torch.randn(2, 8),), passes=_broken_pipeline())
    assert any("FLOAT32 tensor carries quantization" in p for p in e.value.problems)
    unchecked = circle_fx.export(nn.Linear(8, 4).eval(), (torch.randn(2, 8),), passes=_broken_pipeline(),
                                 verify=False)
    assert not unchecked.verified and "verify" not in unchecked.report.timings
    with pytest.raises(VerifyError):  # but it is never handed to onert unchecked
        unchecked.run(torch.randn(2, 8))
    bad = mutate(cm.to_bytes(), lambda m, sg: setattr(sg.operators[0], "inputs", np.array([99, 0])))
    broken = CircleModel(cm.builder, Serialized(memoryview(bad)), cm.report)
    with pytest.raises(VerifyError, match="out of range"):
        broken.run(*inputs)


def test_external_weights_are_verified_on_the_written_file(tmp_path):
    model, x = nn.Linear(64, 64).eval(), torch.randn(2, 64)
    cm = circle_fx.export(model, (x,), external_weights=True)
    assert cm.serialized.external and not cm.verified  # no in-memory copy of the weights to check
    cm.save(tmp_path / "ok.circle")
    assert cm.verified
    bad = circle_fx.export(model, (x,), external_weights=True, passes=_broken_pipeline())
    with pytest.raises(VerifyError, match="circle_fx bug"):
        bad.save(tmp_path / "bad.circle")
    assert list(tmp_path.iterdir()) == [tmp_path / "ok.circle"]  # nothing half-written or invalid left


# ------------------------------------------------------------------ corruptions
def test_not_a_circle_file():
    with pytest.raises(VerifyError, match="not a Circle file"):
        circle_fx.verify(b"garbage!" * 4)
    with pytest.raises(VerifyError, match="no such file"):
        circle_fx.verify("/nonexistent/model.circle")


def test_bad_tensor_index(good):
    def f(m, sg):
        sg.operators[3].inputs[0] = len(sg.tensors) + 5
    assert_problem(mutate(good, f), "operator 3", "out of range")


def test_bad_output_index_and_graph_output(good):
    def f(m, sg):
        sg.outputs[0] = 1000
    assert_problem(mutate(good, f), "graph output", "out of range")


def test_bad_buffer_index(good):
    def f(m, sg):
        sg.tensors[2].buffer = len(m.buffers) + 1
    assert_problem(mutate(good, f), "tensor 2", "buffer index")


def test_bad_opcode_index(good):
    def f(m, sg):
        sg.operators[1].opcodeIndex = len(m.operatorCodes) + 3
    assert_problem(mutate(good, f), "operator 1", "opcode index")


def test_input_used_before_produced(good):
    def f(m, sg):
        # move the FULLY_CONNECTED before the ADD that feeds it
        i, fc = first_op(m, sg, "FULLY_CONNECTED")
        j, _ = first_op(m, sg, "ADD")
        sg.operators.insert(j, sg.operators.pop(i))
    assert_problem(mutate(good, f), "FULLY_CONNECTED", "used before it is produced", "later by operator")


def test_input_never_produced(good):
    def f(m, sg):
        t = circle.Tensor.TensorT()
        t.name, t.shape, t.type, t.buffer = "orphan", [2, 3, 8], circle.TensorType.TensorType.FLOAT32, 0
        sg.tensors.append(t)
        _, add = first_op(m, sg, "ADD")
        add.inputs[1] = len(sg.tensors) - 1
    assert_problem(mutate(good, f), "'orphan'", "no operator produces it")


def test_output_produced_twice(good):
    def f(m, sg):
        sg.operators[1].outputs[0] = sg.operators[0].outputs[0]
    assert_problem(mutate(good, f), "operator 1", "already produced by operator 0")


def test_wrong_constant_buffer_size(good):
    def f(m, sg):
        _, fc = first_op(m, sg, "FULLY_CONNECTED")
        w = sg.tensors[fc.inputs[1]]
        m.buffers[w.buffer].data = m.buffers[w.buffer].data[:-4]
    assert_problem(mutate(good, f), "buffer holds 252 bytes", "needs 256")


def test_missing_options_table(good):
    def f(m, sg):
        _, add = first_op(m, sg, "ADD")
        add.builtinOptionsType, add.builtinOptions = 0, None
    assert_problem(mutate(good, f), "ADD", "AddOptions")


def test_missing_tensor_name(good):
    def f(m, sg):
        sg.tensors[5].name = ""
    assert_problem(mutate(good, f), "tensor 5", "no name")


def test_signature_problems(good):
    def dup(m, sg):
        m.signatureDefs[0].inputs[1].name = m.signatureDefs[0].inputs[0].name
    assert_problem(mutate(good, dup), "signature input names repeat")

    def wrong(m, sg):
        m.signatureDefs[0].outputs[0].tensorIndex = 3
    assert_problem(mutate(good, wrong), "signature outputs point at tensors")

    def none(m, sg):
        m.signatureDefs = []
    assert_problem(mutate(good, none), "no signature def")


# ---------------------------------------------------------------------- shapes
@pytest.mark.parametrize("op", ["ADD", "MUL", "FULLY_CONNECTED", "RESHAPE", "RMS_NORM", "TRANSPOSE",
                                "BATCH_MATMUL", "SOFTMAX", "STRIDED_SLICE", "CONCATENATION", "GATHER",
                                "MEAN", "SUM"])
def test_wrong_output_shape_is_caught(good, op):
    def f(m, sg):
        _, o = first_op(m, sg, op)
        t = sg.tensors[o.outputs[0]]
        t.shape[-1] += 1
        if t.shapeSignature is not None:
            t.shapeSignature[-1] = t.shape[-1]
    assert_problem(mutate(good, f), op)


def test_non_broadcastable_inputs(good):
    def f(m, sg):
        _, mul = first_op(m, sg, "MUL")
        sg.tensors[mul.inputs[1]].shape = np.array([1, 1, 5])
    # the constant's buffer no longer fits either; both are reported
    problems = problems_of(mutate(good, f))
    assert any("do not broadcast" in p for p in problems), problems
    assert any("buffer holds" in p for p in problems), problems


def test_bad_transpose_perm(good):
    def f(m, sg):
        _, tr = first_op(m, sg, "TRANSPOSE")
        m.buffers[sg.tensors[tr.inputs[1]].buffer].data = np.array([0, 1, 1], np.int32).view(np.uint8)
    assert_problem(mutate(good, f), "TRANSPOSE", "not a permutation")


def test_transpose_of_int64_is_refused(good):
    """onert 0.1.0 fails such a TRANSPOSE at run time (XLNet's input_ids.transpose)."""
    def f(m, sg):
        _, tr = first_op(m, sg, "TRANSPOSE")
        for t in (tr.inputs[0], tr.outputs[0]):
            sg.tensors[t].type = circle.TensorType.TensorType.INT64
    assert_problem(mutate(good, f), "TRANSPOSE", "INT64", "FLOAT32 and INT32 only")


def test_rank_7_tensor_is_refused(good):
    """onert 0.1.0 segfaults on a rank-7 tensor (docs/onert-findings.md, "Ranks above 4")."""
    def f(m, sg):
        _, r = first_op(m, sg, "SUM")
        x = sg.tensors[r.inputs[0]]
        x.shape = np.array([1, 1, 1, 1] + list(x.shape), dtype=np.int32)  # 3-D -> 7-D
    assert_problem(mutate(good, f), "rank 7", "crashes")


def test_5d_reduce_is_refused(good):
    """onert 0.1.0 refuses it at session preparation (ShapeValidator)."""
    def f(m, sg):
        _, r = first_op(m, sg, "SUM")
        x = sg.tensors[r.inputs[0]]
        x.shape = np.array([1, 1] + list(x.shape), dtype=np.int32)  # 3-D -> 5-D
    assert_problem(mutate(good, f), "SUM", "input rank 5", "rank <= 4")


def test_5d_comparison_is_refused(good):
    """onert 0.1.0 returns wrong booleans for it, with no error."""
    def f(m, sg):
        for t in sg.tensors:
            if m.buffers[t.buffer].data is None and len(t.shape) == 3:
                t.shape = np.array([1, 1] + list(t.shape), dtype=np.int32)
        code = len(m.operatorCodes)
        m.operatorCodes.append(circle.OperatorCode.OperatorCodeT())
        m.operatorCodes[-1].builtinCode = m.operatorCodes[-1].deprecatedBuiltinCode = BO.LESS
        _, add = first_op(m, sg, "ADD")
        add.opcodeIndex, add.builtinOptionsType, add.builtinOptions = code, 0, None
        sg.tensors[add.outputs[0]].type = circle.TensorType.TensorType.BOOL
    assert_problem(mutate(good, f), "LESS", "rank 5", "correctly up to rank 4")


def test_fc_in_features_mismatch(good):
    def f(m, sg):
        _, fc = first_op(m, sg, "FULLY_CONNECTED")
        w = sg.tensors[fc.inputs[1]]
        w.shape = np.array([16, 4])  # same byte count, wrong in-features
    assert_problem(mutate(good, f), "FULLY_CONNECTED", "in-features")


def test_fc_needs_bias_slot(good):
    def f(m, sg):
        _, fc = first_op(m, sg, "FULLY_CONNECTED")
        fc.inputs = fc.inputs[:2]
    assert_problem(mutate(good, f), "FULLY_CONNECTED", "needs 3")


def test_batch_matmul_contracted_dim_mismatch(good):
    def f(m, sg):
        _, bmm = first_op(m, sg, "BATCH_MATMUL")
        bmm.builtinOptions.adjointRhs = True
    assert_problem(mutate(good, f), "BATCH_MATMUL", "contracted dims differ")


def test_reshape_element_count(good):
    def f(m, sg):
        _, r = first_op(m, sg, "RESHAPE")
        sg.tensors[r.inputs[0]].shape[-1] += 2
    assert_problem(mutate(good, f), "RESHAPE", "element count changes")


def test_gather_axis_out_of_range(good):
    def f(m, sg):
        _, g = first_op(m, sg, "GATHER")
        g.builtinOptions.axis = 5
    assert_problem(mutate(good, f), "GATHER", "axis 5 out of range")


def test_dynamic_dims_match_anything(good):
    def f(m, sg):
        for t in sg.tensors:
            if m.buffers[t.buffer].data is None and len(t.shape) == 3:
                t.shapeSignature = np.array([-1] + list(t.shape[1:]), dtype=np.int32)
    # the shape rules take -1 for anything; the one problem left is onert's static-only RMS_NORM
    with pytest.raises(circle_fx.VerifyError) as info:
        circle_fx.verify(mutate(good, f))
    assert info.value.problems and all("RMS_NORM" in p and "dynamic_rms_norm: a dynamic input" in p
                                       for p in info.value.problems), info.value.problems


def test_shape_signature_must_agree_with_shape(good):
    def f(m, sg):
        t = sg.tensors[sg.inputs[1]]
        t.shapeSignature = np.array([-1, 4, 8], dtype=np.int32)
    assert_problem(mutate(good, f), "shape_signature", "disagrees")


def test_mismatched_operand_types(good):
    def f(m, sg):
        _, add = first_op(m, sg, "ADD")
        sg.tensors[add.inputs[1]].type = circle.TensorType.TensorType.INT32
    assert_problem(mutate(good, f), "ADD", "input types differ", "INT32")


def test_external_weights_verify_and_truncation_is_caught(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    cm = circle_fx.export(model, (torch.randn(2, 64),), external_weights=True)
    assert cm.serialized.external
    report = circle_fx.verify(cm)
    assert report.constants >= 4
    path = cm.save(tmp_path / "ext.circle")
    assert circle_fx.verify(path).operators == report.operators
    data = open(path, "rb").read()
    assert_problem(data[:-100], "external data", "past the end")


class SliceTile(nn.Module):
    def forward(self, x):
        a, b = x.split([3, 5], dim=-1)  # SLICE
        return a.expand(2, 4, 3) * 2.0, b  # BROADCAST_TO


@pytest.mark.parametrize("op", ["SLICE", "BROADCAST_TO"])
def test_wrong_output_shape_slice_broadcast(op):
    data = circle_fx.export(SliceTile(), (torch.randn(1, 4, 8),)).to_bytes()
    circle_fx.verify(data)

    def f(m, sg):
        _, o = first_op(m, sg, op)
        sg.tensors[o.outputs[0]].shape[-1] += 1
    assert_problem(mutate(data, f), op, "should be")
