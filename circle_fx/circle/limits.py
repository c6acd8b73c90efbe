"""Operand ranks onert 0.1.0 handles, per operator (measured: docs/onert-findings.md,
"Ranks above 4"). One place for the numbers: the lowerings and ``emit/rank_limits.py``
stay within them, ``verify`` reports an operator beyond them.
"""
from __future__ import annotations

#: any tensor (a model with a rank-7 input crashes onert even when every op on it is folded)
TENSOR = 6
#: BATCH_MATMUL: operands of rank 2..4 (5-D: "ShapeValidator failed at line 66")
BATCH_MATMUL = 4
#: MEAN / SUM / REDUCE_MAX input (5-D: "ShapeValidator failed at line 304")
REDUCE = 4
#: BROADCAST_TO (rank 6: wrong values, no error; rank 7: the process crashes)
BROADCAST_TO = 5
#: STRIDED_SLICE input (rank 6: "ShapeValidator failed at line 969")
STRIDED_SLICE = 5
#: elementwise ops (EXP, MUL, SUB, SELECT_V2 at rank 7: the process crashes)
ELEMENTWISE = 6
#: SELECT_V2 with a broadcasting operand (scalar, lower rank, size-1 dim): wrong values at rank 5-6
SELECT_V2_BROADCAST = 4
#: LESS / GREATER / EQUAL / NOT_EQUAL ...: wrong booleans, no error, at rank 5 (shapes equal or not)
COMPARISON = 4
COMPARISONS = frozenset({"LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"})


def elementwise_max_rank(name: str, input_dims: list[list], output_dims: list) -> int:
    """The largest output rank at which elementwise op ``name`` (e.g. ``"SELECT_V2"``) is
    computed correctly with operands of these dims."""
    if name == "SELECT_V2" and any(list(d) != list(output_dims) for d in input_dims):
        return SELECT_V2_BROADCAST
    if name in COMPARISONS:
        return COMPARISON
    return ELEMENTWISE
