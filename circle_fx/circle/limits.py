"""What onert 0.1.0 runs, measured (docs/onert-findings.md, /work/shared/onert-0.1.0-matrix.md):
the numbers, and one check function per limit. Which limits an operator has is the Circle op
table's business (``circle/op_table.py``): ``verify`` reports an operator beyond them, and the
legalization stage (``emit/legalize/``) brings every operator within them and checks it after
each step, both by reading that table.

Rank checks: ``(name, input_dims, output_dims, axes) -> message | None``. Form checks (what is
not a rank or an element type: a constant operand, a dynamic dim, a table's shape):
``(name, inputs, outputs) -> message | None`` over ``op_table.Operand`` s (dims, type, const).
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
#: LOGICAL_OR / LOGICAL_AND with a broadcasting operand (size-1 dims, a lower rank): wrong booleans,
#: no error, at rank 5-6 (up to 240 of 288 elements; exact at rank <= 4 and with operands of the
#: output's shape: docs/probes/logical_broadcast.py)
LOGICAL_BROADCAST = 4
#: the elementwise ops whose broadcasting is wrong above a lower rank than :data:`ELEMENTWISE`
BROADCAST_RANK = {"SELECT_V2": SELECT_V2_BROADCAST, "LOGICAL_OR": LOGICAL_BROADCAST, "LOGICAL_AND": LOGICAL_BROADCAST}
#: LESS / GREATER / EQUAL / NOT_EQUAL ...: wrong booleans, no error, at rank 5 (shapes equal or not)
COMPARISON = 4
#: DEPTHWISE_CONV_2D output depth (input channels x multiplier): one channel more and onert
#: 0.1.0 never returns (its float kernel accumulates at most 4832 values per step and steps
#: ``4832 // depth`` output pixels at a time: zero). Measured: 4832 runs, 4848 hangs, for any
#: kernel size or length (docs/onert-findings.md, "DEPTHWISE_CONV_2D deeper than 4832 hangs").
DEPTHWISE_DEPTH = 4832
COMPARISONS = frozenset({"LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"})


def elementwise_max_rank(name: str, input_dims: list[list], output_dims: list) -> int:
    """The largest output rank at which elementwise op ``name`` (e.g. ``"SELECT_V2"``) is
    computed correctly with operands of these dims."""
    if name in BROADCAST_RANK and any(list(d) != list(output_dims) for d in input_dims):
        return BROADCAST_RANK[name]
    if name in COMPARISONS:
        return COMPARISON
    return ELEMENTWISE


#: the axes sets of a 4-D reduction to rank 2 or 3 that onert runs (measured)
REDUCE_DROPS_DIMS_RUN = ((3,), (1, 2))


# ------------------------------------------------------------------ rank checks
# One function per limit, ``(name, input_dims, output_dims, axes) -> message | None``; the Circle
# op table (``circle/op_table.py``) names the one each operator has.
def rms_norm_rank(name, ins, out, axes=None):
    if ins and len(ins[0]) not in RMS_NORM:
        return f"input rank {len(ins[0])}; onert's RMS_NORM takes rank {' or '.join(map(str, RMS_NORM))}"
    return None


def batch_matmul_rank(name, ins, out, axes=None):
    if not all(2 <= len(d) <= BATCH_MATMUL for d in ins[:2]):
        return f"operand ranks {' and '.join(str(len(d)) for d in ins[:2])}; onert takes 2..{BATCH_MATMUL}"
    return None


def reduce_rank(name, ins, out, axes=None):
    """``axes``: the reduction's axes when known (a constant), else its worst case is assumed."""
    if ins and len(ins[0]) > REDUCE:
        return f"input rank {len(ins[0])}; onert's reductions take rank <= {REDUCE}"
    if ins and len(ins[0]) == REDUCE_DROPS_DIMS and len(out) in (2, 3) \
            and (axes is None or tuple(sorted(a % 4 for a in axes)) not in REDUCE_DROPS_DIMS_RUN):
        return (f"a {REDUCE_DROPS_DIMS}-D reduction to rank {len(out)} (keepDims=False); onert fails at "
                "prepare for most such axes: keep the dims and RESHAPE after")
    return None


def pad_rank(name, ins, out, axes=None):
    if ins and len(ins[0]) > PAD:
        return f"input rank {len(ins[0])}; onert's {name} takes rank <= {PAD} (\"Padding for rank > 4 NYI\")"
    return None


def strided_slice_rank(name, ins, out, axes=None):
    if ins and len(ins[0]) > STRIDED_SLICE:
        return f"input rank {len(ins[0])}; onert's STRIDED_SLICE takes rank <= {STRIDED_SLICE}"
    return None


def depthwise_depth(name, ins, out, axes=None):
    if out and out[-1] > DEPTHWISE_DEPTH:
        return (f"output depth {out[-1]}; onert's DEPTHWISE_CONV_2D hangs (never returns) "
                f"beyond depth {DEPTHWISE_DEPTH}")
    return None


def broadcast_to_rank(name, ins, out, axes=None):
    if len(out) > BROADCAST_TO:
        return (f"rank {len(out)}; onert's BROADCAST_TO is correct up to rank {BROADCAST_TO} only "
                "(6: wrong values, 7: crash)")
    return None


def elementwise_rank(name, ins, out, axes=None):
    limit = elementwise_max_rank(name, ins, out)
    if len(out) > limit:
        how = "with broadcasting operands " if limit < ELEMENTWISE else ""
        return f"rank {len(out)}; onert computes {name} {how}correctly up to rank {limit} only"
    return None


# ------------------------------------------------------------------ element types
#: the types the element-type limits (``circle/op_table.py``, ``types=``) were measured on: other
#: types (UINT8, INT16...) and quantized tensors are left to the lowerings that emit them (the
#: quantized-weights paths, measured separately)
MEASURED_TYPES = frozenset({"FLOAT32", "INT32", "INT64", "BOOL", "INT8"})


# ------------------------------------------------------------------ form checks
def constant_lhs(name, ins, outs):
    """BATCH_MATMUL with a constant float lhs: "OperationValidator failed at line 123" at load
    ([12,5] or [2,12,5] constant @ [2,5,7] input; a constant rhs is fine)."""
    if len(ins) > 1 and ins[0].const and ins[0].type == "FLOAT32" and not ins[1].const:
        return "a constant lhs; onert 0.1.0 refuses it at load (\"OperationValidator failed at line 123\")"
    return None


def dynamic_input(name, ins, outs):
    """RMS_NORM with a dynamic dim: "ShapeValidator failed at line 1141" as the model output,
    "num_elements() cannot calculate" at run otherwise, and a static one resized keeps its old
    shape (docs/onert-findings.md, "RMS_NORM is unusable with dynamic or changing shapes")."""
    if ins and ins[0].type == "FLOAT32" and -1 in ins[0].dims:  # (no integer kernel at all)
        return f"a dynamic input {ins[0].dims}; onert 0.1.0's {name} runs static shapes only"
    return None


def holds_several_positions(table_dims) -> bool:
    """A ROPE sin / cos table of these dims holds more than one position (a dim but the last is
    not 1; -1, dynamic, counts as several). The one test of the limit: the RoPE fusion's
    check (FX shapes), :func:`several_positions` (verify, legalization) and the
    ``rope_positions`` step ask it."""
    return len(table_dims) > 0 and any(d != 1 for d in table_dims[:-1])


def several_positions(name, ins, outs):
    """ROPE tables (inputs 1, 2) holding more than one position: onert 0.1.0 applies the first
    row to every position, silently (docs/onert-findings.md, matrix: ROPE)."""
    for what, t in zip(("sin", "cos"), ins[1:3]):
        if holds_several_positions(t.dims):
            return f"{what} table {t.dims} holds several positions; onert 0.1.0's ROPE would use the first for all"
    return None


def ggml_rows(name, ins, outs):
    """A GGML-weight FULLY_CONNECTED whose input is not 2-D or ``[1, rows, in]``: ggml's kernel
    aborts the process (:func:`fully_connected_input_problem`)."""
    if len(ins) > 1 and ins[1].type.startswith("GGML_"):
        return fully_connected_input_problem(ins[0].dims, True)
    return None


def ggml_bias(name, ins, outs):
    """A GGML-weight FULLY_CONNECTED with a bias input: onert's ggml kernel throws (measured). Its
    fused activation, which the kernel ignores, is not an operand: ``verify`` reports it by the
    options (``check_block_uses``), and the ``ggml_bias`` step moves both into an ADD."""
    if len(ins) > 2 and ins[1].type.startswith("GGML_") and ins[2].type:
        return f"a bias with a {ins[1].type} weight; onert 0.1.0's ggml kernel throws on one (add it with ADD)"
    return None


def ggml_gather_ids(name, ins, outs):
    """A GATHER from a GGML block table with indices that are not 1-D int32: onert 0.1.0's GGML
    GATHER takes int32 indices only, and with ids ``[B, T]``, B > 1, fills only the first B-row
    and leaves the rest zero (measured; quant/lowerings/ggml.py)."""
    if len(ins) > 1 and ins[0].type.startswith("GGML_") and (ins[1].type != "INT32" or len(ins[1].dims) != 1):
        return (f"{ins[1].type} indices of shape {list(ins[1].dims)}; onert 0.1.0's GATHER from a {ins[0].type} "
                "table takes 1-D int32 indices only (int64 fails, [B, T] fills only the first row)")
    return None


# ------------------------------------------------------------------ index inputs
#: the legalization step (``emit/index_limits.py``) that clamps GATHER indices read from graph inputs
INDEX_CLAMPS = "index_clamps"
#: operators whose output holds the same values as their first input (an index passes unchanged)
KEEPS_INDEX_VALUES = frozenset({"RESHAPE", "CAST"})
#: the index types onert's GATHER takes from a model input
INDEX_TYPES = frozenset({"INT32", "INT64"})


def index_source(t: int, producers: dict, graph_inputs) -> int | None:
    """The graph input whose values tensor ``t`` holds unchanged (directly, or through
    :data:`KEEPS_INDEX_VALUES` operators; ``producers``: tensor -> ``(op name, inputs)``), or None."""
    while t not in graph_inputs:
        made = producers.get(t)
        if made is None or made[0] not in KEEPS_INDEX_VALUES:
            return None
        t = made[1][0]
    return t


def unclamped_index_problem(input_name: str, rows: int) -> str:
    """A GATHER reading a graph input's values as indices, unclamped: onert 0.1.0 does not check
    GATHER indices, and an id past the table reads outside it and returns whatever is there, no
    error (docs/onert-findings.md; torch raises IndexError)."""
    return (f"{INDEX_CLAMPS}: indices from graph input {input_name!r} reach the GATHER of a {rows}-row table "
            "unclamped; onert 0.1.0 reads outside the table for an id out of range, without an error")


# ------------------------------------------------------------------ graph outputs
#: the legalization step (``emit/legalize/outputs.py``) that gives such outputs a tensor of their own
OUTPUT_COPIES = "output_copies"


def tail_start(op_outputs: list[list[int]], graph_outputs: set) -> int:
    """Index of the first operator of the trailing run whose operators write graph outputs only
    (the output copies, the last result): reading an output there is safe (measured below)."""
    k = len(op_outputs)
    while k and all(o in graph_outputs for o in op_outputs[k - 1]):
        k -= 1
    return k


def output_read_problem(readers: list[int]) -> str | None:
    """A graph output read by operators ``readers`` (those before :func:`tail_start`): onert
    0.1.0 reuses its memory for a later result and returns that (measured: y = x + 1 also read
    by MUL, MUL: y comes back as the second MUL's result; read only by the last operator, which
    writes another output, y comes back right)."""
    if readers:
        return (f"{OUTPUT_COPIES}: also read by operator(s) {readers[:4]}; onert 0.1.0 reuses a graph output's "
                "memory for later results and returns those (write the output with a RESHAPE of its own)")
    return None


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
