"""The legalization stage (circle_fx.emit.legalize): declared steps, a check after each."""
import numpy as np
import pytest

from circle_fx import LegalizeError
from circle_fx.circle.schema import BO, TT, make_options
from circle_fx.emit.builder import ModelBuilder
from circle_fx.emit.legalize import RANKS, STEPS, TYPES, check, legalize


def _one_op(code, in_shapes, out_shape, ttype=TT.FLOAT32, consts=(), opts=None):
    mb = ModelBuilder()
    ins = [mb.add_tensor(f"in{k}", s, ttype) for k, s in enumerate(in_shapes)]
    ins += [mb.add_constant(f"c{k}", np.asarray(c, np.int32)) for k, c in enumerate(consts)]
    out = mb.add_tensor("out", out_shape, ttype)
    mb.add_operator(code, ins, [out], opts, "model.py:7")
    mb.inputs, mb.outputs = ins[:len(in_shapes)], [out]
    return mb


def test_steps_are_declared_in_order():
    assert [s.name for s in STEPS] == ["constant_lhs", "dynamic_rms_norm", "rope_positions", "ggml_rows", "ggml_bias",
                                       "ggml_gather_ids", "types", "ranks", "peephole", "index_clamps",
                                       "output_copies"]
    assert [s.name for s in STEPS if not s.required] == ["peephole", "index_clamps"]


def test_ranks_step_folds_a_high_rank_elementwise_op_and_checks():
    mb = _one_op(BO.LESS, [[2, 3, 1, 4, 5], [2, 3, 1, 4, 5]], [2, 3, 1, 4, 5])
    mb.tensors[mb.outputs[0]].type = TT.BOOL
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    less = [op for op in mb.operators if op.code == BO.LESS]
    assert len(less) == 1 and len(mb.dims(less[0].outputs[0])) <= 4


def test_an_operator_no_step_fixes_is_a_legalize_error_naming_the_step():
    # a depthwise convolution too deep for onert whose filter is a run-time tensor: the channel
    # split needs the filter's values, so no step can fix it
    depth = 4840
    mb = _one_op(BO.DEPTHWISE_CONV_2D, [[1, 1, 4, depth], [1, 1, 1, depth], [depth]], [1, 1, 4, depth],
                 opts=make_options("DepthwiseConv2DOptions", depthMultiplier=1, strideW=1, strideH=1))
    with pytest.raises(LegalizeError) as info:
        legalize(mb, set(mb.inputs) | set(mb.outputs))
    assert info.value.step == "ranks" and "DEPTHWISE_CONV_2D at model.py:7" in str(info.value)
    assert "output depth 4840" in str(info.value)


def test_check_reports_only_what_the_steps_so_far_ensure():
    mb = _one_op(BO.TRANSPOSE, [[2, 3]], [3, 2], TT.BOOL, consts=([1, 0],))
    check(mb, "nothing", set())  # no step has promised anything yet
    check(mb, "ranks only", {RANKS})
    with pytest.raises(LegalizeError, match="(?s)after the .types. legalization step.*TRANSPOSE.*BOOL"):
        check(mb, "types", {TYPES})
    legalize(mb, set(mb.inputs) | set(mb.outputs))  # the types step carries bool through int32
    assert [op.code for op in mb.operators] == [BO.CAST, BO.TRANSPOSE, BO.CAST]


def test_ranks_step_runs_rms_norm_of_any_rank_as_three_d():
    mb = _one_op(BO.RMS_NORM, [[6, 8]], [6, 8], opts=make_options("RmsNormOptions", epsilon=1e-6))
    gamma = mb.add_constant("gamma", np.ones(8, np.float32))
    mb.operators[0].inputs.append(gamma)
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    norm = next(op for op in mb.operators if op.code == BO.RMS_NORM)
    assert mb.dims(norm.inputs[0]) == [1, 6, 8] and norm.inputs[1] == gamma
    assert [op.code for op in mb.operators] == [BO.RESHAPE, BO.RMS_NORM, BO.RESHAPE]


def test_ranks_step_folds_broadcast_to_by_runs():
    mb = _one_op(BO.BROADCAST_TO, [[2, 1, 1, 4, 5, 1]], [2, 3, 6, 4, 5, 7], consts=([2, 3, 6, 4, 5, 7],))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    (bcast,) = [op for op in mb.operators if op.code == BO.BROADCAST_TO]
    assert mb.dims(bcast.inputs[0]) == [2, 1, 20, 1] and mb.dims(bcast.outputs[0]) == [2, 18, 20, 7]


def test_ranks_step_refuses_a_broadcast_no_fold_brings_within_rank_five():
    from circle_fx.errors import UnsupportedOpError

    mb = _one_op(BO.BROADCAST_TO, [[2, 1, 2, 1, 2, 1]], [2, 3, 2, 3, 2, 3], consts=([2, 3, 2, 3, 2, 3],))
    with pytest.raises(UnsupportedOpError, match="model.py:7 needs a rank-6 BROADCAST_TO"):
        legalize(mb, set(mb.inputs) | set(mb.outputs))


def test_ranks_step_folds_a_rank5_batch_matmul_into_rank4():
    mb = _one_op(BO.BATCH_MATMUL, [[2, 1, 3, 4, 5], [1, 4, 3, 5, 6]], [2, 4, 3, 4, 6],
                 opts=make_options("BatchMatMulOptions"))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    (mm,) = [op for op in mb.operators if op.code == BO.BATCH_MATMUL]
    # runs: [2] 1 in b, [1] 1 in a, [3] same -> three runs: expanded to one batch dim of 24
    assert mb.dims(mm.inputs[0]) == [24, 4, 5] and mb.dims(mm.inputs[1]) == [24, 5, 6]
    assert [op.code for op in mb.operators].count(BO.BROADCAST_TO) == 2


def test_ranks_step_folds_two_broadcast_runs_without_expanding():
    mb = _one_op(BO.BATCH_MATMUL, [[2, 3, 1, 1, 4, 5], [1, 1, 6, 7, 5, 6]], [2, 3, 6, 7, 4, 6],
                 opts=make_options("BatchMatMulOptions"))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    assert BO.BROADCAST_TO not in [op.code for op in mb.operators]
    (mm,) = [op for op in mb.operators if op.code == BO.BATCH_MATMUL]
    assert mb.dims(mm.inputs[0]) == [6, 1, 4, 5] and mb.dims(mm.inputs[1]) == [42, 5, 6]


def test_ranks_step_folds_a_five_d_reduction_into_runs():
    # reduced/kept alternate in 5 runs: the kept runs move in front (TRANSPOSE), [kept, reduced]
    mb = _one_op(BO.SUM, [[2, 3, 4, 5, 6]], [3, 5], consts=([0, 2, 4],),
                 opts=make_options("ReducerOptions", keepDims=False))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    (red,) = [op for op in mb.operators if op.code == BO.SUM]
    assert BO.TRANSPOSE in [op.code for op in mb.operators]
    assert mb.dims(red.inputs[0]) == [15, 48] and list(mb.values(red.inputs[1])) == [1]


def test_ranks_step_keeps_dims_of_a_four_d_reduction():
    # onert fails at prepare on most 4-D reductions to rank 2 or 3 ([3] and [1, 2] run)
    mb = _one_op(BO.MEAN, [[2, 3, 4, 5]], [3, 5], consts=([0, 2],),
                 opts=make_options("ReducerOptions", keepDims=False))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    (red,) = [op for op in mb.operators if op.code == BO.MEAN]
    assert red.options.keepDims and mb.dims(red.outputs[0]) == [1, 3, 1, 5]
    assert [op.code for op in mb.operators] == [BO.MEAN, BO.RESHAPE]
    for axes, out in (([1, 2], [2, 5]), ([3], [2, 3, 4]), ([0, 1, 2], [5])):  # measured to run as they are
        mb = _one_op(BO.MEAN, [[2, 3, 4, 5]], out, consts=(axes,), opts=make_options("ReducerOptions", keepDims=False))
        legalize(mb, set(mb.inputs) | set(mb.outputs))
        assert [op.code for op in mb.operators] == [BO.MEAN], axes


def test_ranks_step_folds_a_six_d_strided_slice_around_the_sliced_dim():
    mb = _one_op(BO.STRIDED_SLICE, [[2, 3, 4, 5, 6, 7]], [2, 3, 2, 5, 6, 7],
                 consts=([0, 0, 1, 0, 0, 0], [2, 3, 3, 5, 6, 7], [1, 1, 1, 1, 1, 1]),
                 opts=make_options("StridedSliceOptions"))
    legalize(mb, set(mb.inputs) | set(mb.outputs))
    (sl,) = [op for op in mb.operators if op.code == BO.STRIDED_SLICE]
    assert mb.dims(sl.inputs[0]) == [6, 4, 210] and mb.dims(sl.outputs[0]) == [6, 2, 210]
    assert [list(mb.values(t)) for t in sl.inputs[1:]][0] == [0, 1, 0]
