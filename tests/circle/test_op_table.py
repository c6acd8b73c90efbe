"""The Circle op table (circle/op_table.py): one row per op that verify, the limit checks and the
legalization stage read; every name a row gives resolves in the module that implements it."""
from __future__ import annotations

from circle_fx.circle import limits, op_table, verify
from circle_fx.circle.schema import BO, options_class_name


def test_every_row_names_a_shape_rule_and_a_fold_that_exist():
    from circle_fx.emit.legalize import ranks

    assert {r.shape for r in op_table.OPS.values()} == set(verify.SHAPE_RULES)  # none missing, none unused
    folds = {r.fold for r in op_table.OPS.values() if r.fold}
    assert folds == set(ranks.STRATEGIES)
    assert set(ranks.FOLDS) == {r.code for r in op_table.OPS.values() if r.fold}


def test_rows_are_circle_builtins_with_their_schema_options():
    for name, r in op_table.OPS.items():
        assert getattr(BO, name) == r.code and op_table.row(r.code) is r
        assert r.options == options_class_name(r.code)
    assert op_table.OPS["FULLY_CONNECTED"].options == "FullyConnectedOptions"
    assert op_table.OPS["MEAN"].options == "ReducerOptions"


def test_element_types_are_measured_ones():
    for name, (positions, runs) in op_table.ELEMENT_TYPES.items():
        assert "FLOAT32" in runs and runs <= limits.MEASURED_TYPES, name
    assert op_table.unsupported_type("SELECT_V2", ["INT64"]) == "INT64"
    assert op_table.data_inputs("SELECT_V2", 3) == [1, 2]  # the values, not the bool condition


def test_rank_and_form_limits_come_from_the_row():
    assert "rank <= 4" in op_table.rank_problem("MEAN", [[1, 2, 3, 4, 5], [1]], [1, 2, 3, 4], [4])
    assert op_table.rank_problem("RESHAPE", [[1] * 6, [6]], [1] * 6) is None  # no rank limit
    a = op_table.Operand([6, 5], "FLOAT32", True)
    b = op_table.Operand([2, 5, 7], "FLOAT32", False)
    out = op_table.Operand([2, 6, 7], "FLOAT32", False)
    assert [n for n, _ in op_table.form_problems("BATCH_MATMUL", [a, b], [out])] == ["constant_lhs"]
    assert op_table.form_problems("BATCH_MATMUL", [b, a], [out]) == []  # a constant rhs runs
    assert op_table.form_problems("BATCH_MATMUL", [a, b], [out], only={"ranks"}) == []
