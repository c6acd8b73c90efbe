"""The Circle op table: per Circle builtin operator circle_fx emits, everything the artifact side
knows about it, in one row that ``verify``, the limit checks and the legalization stage all read.

A row (:class:`CircleOp`) names

- ``shape``: the output-shape rule ``verify`` checks it with (a function of ``circle/verify.py``,
  by name: ``tests/circle/test_op_table.py`` checks that every name has one);
- ``rank``: its rank limit in onert 0.1.0 (a check function of ``circle/limits.py``), and
  ``reads_axes`` when that check reads the constant axes operand (reductions);
- ``types``: the element types its kernel runs, ``(data input positions or None = all, type
  names)``, measured on [2,4] inputs of every type in ``limits.MEASURED_TYPES`` (FLOAT32, INT32,
  INT64, BOOL, INT8), exact where listed; the others fail at run time ("StridedSlice:
  unsupported data type", "Select: unsupported data type", ...) or, for REDUCE_MAX and ARG_MAX,
  at load / prepare (docs/onert-findings.md, "Element types"; ``test_table_matches_onert``
  re-measures them);
- ``forms``: its other onert limits, ``(limit name, check)`` (a constant lhs, a dynamic input,
  a table holding several positions, a GGML weight's input rank, a GGML table's indices), each fixed by the legalization step of that name
  (``emit/legalize/forms.py``);
- ``options``: its options table (``schema.options_class_name``: onert segfaults without it);
- ``fold``: how the ``ranks`` legalization step brings it within its rank limit (a fold of
  ``emit/legalize/ranks.py``, by name), or None when it is not folded.

A new Circle op is one row here (plus its shape rule in verify and, if onert limits it, the
check in limits.py and the fold or form step that fixes it). No torch: this is ``circle/``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import limits
from .schema import BO, options_class_name

#: a form limit: ``(name, check)``, ``check(op_name, inputs, outputs) -> message | None``
FormLimit = tuple[str, Callable]

CONSTANT_LHS = ("constant_lhs", limits.constant_lhs)
DYNAMIC_RMS_NORM = ("dynamic_rms_norm", limits.dynamic_input)
ROPE_POSITIONS = ("rope_positions", limits.several_positions)
GGML_ROWS = ("ggml_rows", limits.ggml_rows)
GGML_GATHER_IDS = ("ggml_gather_ids", limits.ggml_gather_ids)
GGML_BIAS = ("ggml_bias", limits.ggml_bias)


@dataclass(frozen=True)
class Operand:
    """What a form check sees of an operand: dims (-1 dynamic), element type name, constant."""
    dims: list
    type: str
    const: bool


@dataclass(frozen=True)
class CircleOp:
    name: str
    shape: str
    rank: Callable | None = None
    reads_axes: bool = False
    types: tuple | None = None
    forms: tuple[FormLimit, ...] = ()
    fold: str | None = None

    @property
    def code(self) -> int:
        return getattr(BO, self.name)

    @property
    def options(self) -> str | None:
        return options_class_name(self.code)


_F32_I32 = frozenset({"FLOAT32", "INT32"})
_F32_INTS = frozenset({"FLOAT32", "INT32", "INT64"})

#: elementwise operators: binary ones broadcast their operands, unary ones keep their input's shape
BINARY_ELEMENTWISE = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
                      "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL",
                      "LOGICAL_AND", "LOGICAL_OR", "SELECT_V2", "FLOOR_DIV", "FLOOR_MOD")
UNARY_ELEMENTWISE = ("NEG", "EXP", "LOG", "SQRT", "RSQRT", "SIN", "COS", "TANH", "ABS", "LOGISTIC", "RELU",
                     "SQUARE", "LOGICAL_NOT", "GELU", "FLOOR", "ROUND", "CAST", "SOFTMAX", "LOG_SOFTMAX", "HARD_SWISH",
                     "LEAKY_RELU", "QUANTIZE", "DEQUANTIZE")
#: not folded by rank: they work along the last axis or carry per-axis quantization
_NOT_FOLDED = frozenset({"SOFTMAX", "LOG_SOFTMAX", "QUANTIZE", "DEQUANTIZE"})
#: element types of the elementwise ops that have a measured limit
_ELEMENTWISE_TYPES = {"SELECT_V2": ((1, 2), frozenset({"FLOAT32"}))}  # values only: the condition is BOOL
#: SQUARE on int32 / int64: "Square: Unsupported data type" at prepare (docs/onert-findings.md)
_UNARY_TYPES = {"SQUARE": ((0,), frozenset({"FLOAT32"}))}

_ROWS = [
    *(CircleOp(n, "elementwise", limits.elementwise_rank, types=_ELEMENTWISE_TYPES.get(n),
               fold=None if n in _NOT_FOLDED else "elementwise") for n in BINARY_ELEMENTWISE),
    *(CircleOp(n, "dequantize" if n == "DEQUANTIZE" else "same_as_input", limits.elementwise_rank,
               types=_UNARY_TYPES.get(n), fold=None if n in _NOT_FOLDED else "elementwise") for n in UNARY_ELEMENTWISE),
    CircleOp("RMS_NORM", "rms_norm", limits.rms_norm_rank, forms=(DYNAMIC_RMS_NORM,), fold="rms_norm"),
    CircleOp("ROPE", "rope", forms=(ROPE_POSITIONS,)),
    CircleOp("FULLY_CONNECTED", "fully_connected", forms=(GGML_ROWS, GGML_BIAS)),
    CircleOp("BATCH_MATMUL", "batch_matmul", limits.batch_matmul_rank, forms=(CONSTANT_LHS,), fold="batch_matmul"),
    CircleOp("RESHAPE", "reshape"),
    CircleOp("TRANSPOSE", "transpose", types=((0,), _F32_I32)),
    CircleOp("CONCATENATION", "concatenation", types=(None, frozenset({"FLOAT32", "INT32", "INT64", "INT8"}))),
    CircleOp("GATHER", "gather", types=((0,), _F32_I32), forms=(GGML_GATHER_IDS,)),
    *(CircleOp(n, "reduce", limits.reduce_rank, reads_axes=True, fold="reduce",
               types=((0,), _F32_I32) if n == "REDUCE_MAX" else None) for n in ("MEAN", "SUM", "REDUCE_MAX")),
    CircleOp("STRIDED_SLICE", "strided_slice", limits.strided_slice_rank, types=((0,), _F32_INTS),
             fold="strided_slice"),
    CircleOp("SLICE", "slice", types=((0,), frozenset({"FLOAT32"}))),
    CircleOp("TILE", "tile", types=((0,), frozenset({"FLOAT32"}))),
    *(CircleOp(n, "pad", limits.pad_rank, types=(p, frozenset({"FLOAT32", "INT8"})), fold="pad")
      for n, p in (("PAD", (0,)), ("PADV2", (0, 2)))),
    CircleOp("BROADCAST_TO", "broadcast_to", limits.broadcast_to_rank, types=((0,), _F32_I32), fold="broadcast_to"),
    CircleOp("ARG_MAX", "arg_max", types=((0,), _F32_I32)),  # int8: compares as unsigned (wrong)
    CircleOp("ARG_MIN", "arg_max"),
    CircleOp("CONV_2D", "conv_2d"),
    CircleOp("DEPTHWISE_CONV_2D", "depthwise_conv_2d", limits.depthwise_depth, fold="depthwise_split"),
    CircleOp("SPLIT", "split", types=((1,), _F32_INTS)),
    CircleOp("MAX_POOL_2D", "pool_2d"),
    CircleOp("AVERAGE_POOL_2D", "pool_2d"),
    CircleOp("IF", "if"),  # the entry-point dispatch of a multi-subgraph file (emit/entry_points.py)
]

#: Circle name -> its row
OPS: dict[str, CircleOp] = {row.name: row for row in _ROWS if hasattr(BO, row.name)}
#: builtin code -> its row
BY_CODE: dict[int, CircleOp] = {row.code: row for row in OPS.values()}
#: ``name -> (data input positions, type names)`` of the rows with element-type limits
ELEMENT_TYPES = {row.name: row.types for row in OPS.values() if row.types is not None}


def row(code: int) -> CircleOp | None:
    return BY_CODE.get(code)


def rank_problem(name: str, input_dims: list[list], output_dims: list, axes=None) -> str | None:
    """Why onert 0.1.0 would refuse, crash on, hang on or miscompute operator ``name`` with
    operands of these dims (a message), or None when they are within its limits. ``axes``: a
    reduction's axes when known (a constant), else its worst case is assumed."""
    r = OPS.get(name)
    return r.rank(name, input_dims, output_dims, axes) if r is not None and r.rank is not None else None


def form_problems(name: str, inputs: list[Operand], outputs: list[Operand], only=None) -> list[tuple[str, str]]:
    """``(limit name, message)`` for each form limit of ``name`` these operands break (``only``:
    the limit names to check, default all)."""
    r = OPS.get(name)
    if r is None:
        return []
    return [(limit, msg) for limit, check in r.forms if (only is None or limit in only)
            and (msg := check(name, inputs, outputs))]


def data_inputs(name: str, n_inputs: int) -> list[int]:
    """Positions of operator ``name``'s inputs whose element type its kernel must support."""
    positions = ELEMENT_TYPES[name][0]
    return list(range(n_inputs)) if positions is None else [p for p in positions if p < n_inputs]


def unsupported_type(name: str, type_names: list[str]) -> str | None:
    """The first of these data-input types onert 0.1.0's ``name`` kernel does not run (a
    measured type only), or None."""
    if name not in ELEMENT_TYPES:
        return None
    runs = ELEMENT_TYPES[name][1]
    return next((t for t in type_names if t in limits.MEASURED_TYPES and t not in runs), None)
