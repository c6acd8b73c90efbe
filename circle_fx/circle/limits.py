"""Operand ranks onert 0.1.0 handles, per operator (measured: docs/onert-findings.md,
"Ranks above 4") and the element types their kernels run. One place for the numbers and the
rules: the legalization stage (``emit/legalize/``) brings every operator within them and
checks it after each step, and ``verify`` reports an operator beyond them, both through
:func:`rank_problem` and :func:`unsupported_type`.
"""
from __future__ import annotations

#: any tensor (a model with a rank-7 input crashes onert even when every op on it is folded)
TENSOR = 6
#: BATCH_MATMUL: operands of rank 2..4 (5-D: "ShapeValidator failed at line 66")
BATCH_MATMUL = 4
def fully_connected_input_problem(input_dims: list, block_weight: bool) -> str | None:
    """FULLY_CONNECTED flattens an N-D input to ``[rows, in]`` itself, except with a GGML block
    weight (``block_weight``): ggml's kernel then aborts the whole process (``ggml_abort``, no
    error) on an input of rank > 2 whose leading dims (all but the last two) are not all 1
    (measured: ``[2, 3, 64]`` and ``[2, 3, 4, 64]`` abort, ``[1, 32, 64]`` and any 2-D input run;
    a dynamic leading dim counts as not 1)."""
    if block_weight and len(input_dims) > 2 and any(d != 1 for d in input_dims[:-2]):
        return (f"a GGML-weight FULLY_CONNECTED input of shape {list(input_dims)} (onert's ggml kernel "
                "aborts the process unless the input is 2-D or [1, rows, in])")
    return None



#: MEAN / SUM / REDUCE_MAX input (5-D: "ShapeValidator failed at line 304")
REDUCE = 4
#: a MEAN / SUM / REDUCE_MAX of this input rank to output rank 2 or 3 (keepDims=False) fails at
#: prepare for every axes set but :data:`REDUCE_DROPS_DIMS_RUN` (a 3-axis one runs): it keeps the
#: dims and RESHAPEs after (measured on every axes set: docs/onert-findings.md)
REDUCE_DROPS_DIMS = 4
#: BROADCAST_TO (rank 6: wrong values, no error; rank 7: the process crashes)
BROADCAST_TO = 5
#: STRIDED_SLICE input (rank 6: "ShapeValidator failed at line 969")
STRIDED_SLICE = 5
#: PAD / PADV2 input ("Padding for rank > 4 NYI" at run time; the model loads and verifies otherwise)
PAD = 4
#: RMS_NORM input ranks (onert's kernel takes 3-D and 4-D inputs only)
RMS_NORM = (3, 4)
#: elementwise ops (EXP, MUL, SUB, SELECT_V2 at rank 7: the process crashes)
ELEMENTWISE = 6
#: SELECT_V2 with a broadcasting operand (scalar, lower rank, size-1 dim): wrong values at rank 5-6
SELECT_V2_BROADCAST = 4
#: LESS / GREATER / EQUAL / NOT_EQUAL ...: wrong booleans, no error, at rank 5 (shapes equal or not)
COMPARISON = 4
#: DEPTHWISE_CONV_2D output depth (input channels x multiplier): one channel more and onert
#: 0.1.0 never returns (its float kernel accumulates at most 4832 values per step and steps
#: ``4832 // depth`` output pixels at a time: zero). Measured: 4832 runs, 4848 hangs, for any
#: kernel size or length (docs/onert-findings.md, "DEPTHWISE_CONV_2D deeper than 4832 hangs").
DEPTHWISE_DEPTH = 4832
COMPARISONS = frozenset({"LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"})


#: elementwise operators (by Circle name): binary ones broadcast their operands, unary ones keep
#: their input's shape. ``verify`` checks them by these lists and ``emit/legalize/ranks.py`` folds
#: the ones whose rank limit above applies (every one but the per-row / quantizing ones).
BINARY_ELEMENTWISE = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
                      "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL",
                      "LOGICAL_AND", "LOGICAL_OR", "SELECT_V2", "FLOOR_DIV", "FLOOR_MOD")
UNARY_ELEMENTWISE = ("NEG", "EXP", "LOG", "SQRT", "RSQRT", "SIN", "COS", "TANH", "ABS", "LOGISTIC", "RELU",
                     "SQUARE", "LOGICAL_NOT", "GELU", "FLOOR", "ROUND", "CAST", "SOFTMAX", "LOG_SOFTMAX", "HARD_SWISH",
                     "LEAKY_RELU", "QUANTIZE", "DEQUANTIZE")
#: not folded by rank: they work along the last axis or carry per-axis quantization
NOT_FOLDED = frozenset({"SOFTMAX", "LOG_SOFTMAX", "QUANTIZE", "DEQUANTIZE"})


def elementwise_max_rank(name: str, input_dims: list[list], output_dims: list) -> int:
    """The largest output rank at which elementwise op ``name`` (e.g. ``"SELECT_V2"``) is
    computed correctly with operands of these dims."""
    if name == "SELECT_V2" and any(list(d) != list(output_dims) for d in input_dims):
        return SELECT_V2_BROADCAST
    if name in COMPARISONS:
        return COMPARISON
    return ELEMENTWISE


REDUCTIONS = frozenset({"MEAN", "SUM", "REDUCE_MAX"})


#: the axes sets of a 4-D reduction to rank 2 or 3 that onert runs (measured)
REDUCE_DROPS_DIMS_RUN = ((3,), (1, 2))


def rank_problem(name: str, input_dims: list[list], output_dims: list, axes=None) -> str | None:
    """Why onert 0.1.0 would refuse, crash on, hang on or miscompute operator ``name`` with
    operands of these dims (a message), or None when they are within its limits. ``axes``: a
    reduction's axes when known (a constant), else its worst case is assumed."""
    if name == "RMS_NORM" and input_dims and len(input_dims[0]) not in RMS_NORM:
        return f"input rank {len(input_dims[0])}; onert's RMS_NORM takes rank {' or '.join(map(str, RMS_NORM))}"
    if name == "BATCH_MATMUL" and not all(2 <= len(d) <= BATCH_MATMUL for d in input_dims[:2]):
        return f"operand ranks {' and '.join(str(len(d)) for d in input_dims[:2])}; onert takes 2..{BATCH_MATMUL}"
    if name in REDUCTIONS and input_dims and len(input_dims[0]) > REDUCE:
        return f"input rank {len(input_dims[0])}; onert's reductions take rank <= {REDUCE}"
    if name in REDUCTIONS and input_dims and len(input_dims[0]) == REDUCE_DROPS_DIMS and len(output_dims) in (2, 3) \
            and (axes is None or tuple(sorted(a % 4 for a in axes)) not in REDUCE_DROPS_DIMS_RUN):
        return (f"a {REDUCE_DROPS_DIMS}-D reduction to rank {len(output_dims)} (keepDims=False); onert fails at "
                "prepare for most such axes: keep the dims and RESHAPE after")
    if name in ("PAD", "PADV2") and input_dims and len(input_dims[0]) > PAD:
        return f"input rank {len(input_dims[0])}; onert's {name} takes rank <= {PAD} (\"Padding for rank > 4 NYI\")"
    if name == "STRIDED_SLICE" and input_dims and len(input_dims[0]) > STRIDED_SLICE:
        return f"input rank {len(input_dims[0])}; onert's STRIDED_SLICE takes rank <= {STRIDED_SLICE}"
    if name == "DEPTHWISE_CONV_2D" and output_dims and output_dims[-1] > DEPTHWISE_DEPTH:
        return (f"output depth {output_dims[-1]}; onert's DEPTHWISE_CONV_2D hangs (never returns) "
                f"beyond depth {DEPTHWISE_DEPTH}")
    if name == "BROADCAST_TO" and len(output_dims) > BROADCAST_TO:
        return (f"rank {len(output_dims)}; onert's BROADCAST_TO is correct up to rank {BROADCAST_TO} only "
                "(6: wrong values, 7: crash)")
    if name in BINARY_ELEMENTWISE or name in UNARY_ELEMENTWISE:
        limit = elementwise_max_rank(name, input_dims, output_dims)
        if len(output_dims) > limit:
            how = "with broadcasting operands " if limit < ELEMENTWISE else ""
            return f"rank {len(output_dims)}; onert computes {name} {how}correctly up to rank {limit} only"
    return None


# ------------------------------------------------------------------ element types
#: Element types onert 0.1.0's data-movement kernels run, per operator: ``op -> (positions of
#: the data inputs, None = all; type names)``. Measured on [2,4] inputs, every type tried
#: (FLOAT32, INT32, INT64, BOOL, INT8), exact where listed; the others fail at run time
#: ("StridedSlice: unsupported data type", "Slice: ...", "Gather: unsupported input data
#: type", ...) or, for REDUCE_MAX and ARG_MAX, at load/prepare (docs/onert-findings.md, "Element types").
#: ``emit/legalize/types.py`` routes other types through an exact carrier; verify reports them.
ELEMENT_TYPES: dict[str, tuple[tuple[int, ...] | None, frozenset[str]]] = {
    "STRIDED_SLICE": ((0,), frozenset({"FLOAT32", "INT32", "INT64"})),
    "SPLIT": ((1,), frozenset({"FLOAT32", "INT32", "INT64"})),
    "CONCATENATION": (None, frozenset({"FLOAT32", "INT32", "INT64", "INT8"})),
    "SLICE": ((0,), frozenset({"FLOAT32"})),
    "BROADCAST_TO": ((0,), frozenset({"FLOAT32", "INT32"})),
    "TRANSPOSE": ((0,), frozenset({"FLOAT32", "INT32"})),
    "GATHER": ((0,), frozenset({"FLOAT32", "INT32"})),
    "TILE": ((0,), frozenset({"FLOAT32"})),
    "PAD": ((0,), frozenset({"FLOAT32", "INT8"})),
    "PADV2": ((0, 2), frozenset({"FLOAT32", "INT8"})),
    "REDUCE_MAX": ((0,), frozenset({"FLOAT32", "INT32"})),
    "ARG_MAX": ((0,), frozenset({"FLOAT32", "INT32"})),  # int8: compares as unsigned (wrong)
}
#: the types the table was measured on: other types (UINT8, INT16...) and quantized tensors are
#: left to the lowerings that emit them (the quantized-weights paths, measured separately)
MEASURED_TYPES = frozenset({"FLOAT32", "INT32", "INT64", "BOOL", "INT8"})


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
    return next((t for t in type_names if t in MEASURED_TYPES and t not in runs), None)


# ------------------------------------------------------------ per architecture
#: onert 0.1.0 ships two CPU wheels, x86_64 and aarch64 (the devices'). Every limit above was measured on
#: x86_64 and re-measured on aarch64 under qemu-user (``benchmarks/arm64_limits.py``, docs/onert-findings.md
#: "aarch64"): they hold on both, except the operators listed here, ``{op: {architecture: what goes wrong}}``.
#: circle_fx never emits them; ``verify`` reports one in a file (a warning and ``VerifyReport.arch_limits``,
#: not an error: the file may be meant for the architecture it runs right on). The GGML kernels' AVX-512
#: need on x86_64 is a CPU property, probed at run time (``ggml_support.py``), not listed here.
ARCH_ONLY: dict[str, dict[str, str]] = {
    "SPLIT_V": {"x86_64": "returns all zeros (aarch64: exact)"},
}


def arch_problems(op_names) -> list[str]:
    """One message per operator name in :data:`ARCH_ONLY` among ``op_names`` (any iterable)."""
    return [f"{name}: onert 0.1.0 on {arch} {why}" for name in sorted(set(op_names) & ARCH_ONLY.keys())
            for arch, why in ARCH_ONLY[name].items()]
