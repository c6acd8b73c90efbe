"""Index inputs are safe, and the file says what its inputs may be.

onert's GATHER does not check its indices: a token id past the vocabulary reads outside the
embedding table and returns whatever is there, without an error (docs/onert-findings.md;
torch raises IndexError). After lowering, :func:`guard_indices` finds every GATHER whose
indices come from a graph input (directly or through RESHAPE/CAST, which
keep the values), records the valid range ``[0, rows - 1]`` of that input (the intersection
over all its GATHERs) and, unless ``clamp`` is False, clamps the indices with MINIMUM and
MAXIMUM in front of the GATHER, so no input value can make onert read outside a table
(cost: benchmarks/index_clamp.py).

:func:`limits_json` is what the file stores as the Circle metadata entry ``circle_fx.limits``
(UTF-8 JSON in a buffer, read back by ``CircleModel.load``, the LLM runner and ``inspect``)::

    {"version": 1,
     "inputs": {"input_ids": {"index_range": [0, 255]},      # ids outside it are invalid
                "x": {"max_dims": {"1": 64}}},              # dim 1 is correct up to 64 only
     "max_seq_len": 64}                                      # LLM packages: KV-cache positions

A C++ host reads it with the flatbuffers API: ``model->metadata()`` -> the entry named
``circle_fx.limits`` -> ``model->buffers()->Get(entry->buffer())->data()``, a JSON text
(README, "Run-time limits").
"""
from __future__ import annotations

import json

import numpy as np

from ..circle.limits import INDEX_TYPES, index_source, unclamped_index_problem
from ..circle.reader import LIMITS_METADATA
from ..circle.schema import CIRCLE_TO_NUMPY, NUMPY_TO_CIRCLE, make_options, options_class_name, type_name
from .builder import BO, ModelBuilder, OperatorInfo, op_name


def _index_gathers(mb: ModelBuilder):
    """``(operator, graph input tensor, table rows)`` of each GATHER whose integer indices are a
    graph input's values (through RESHAPE / CAST: ``limits.index_source``) along a static axis."""
    producers = {o: (op_name(op.code), op.inputs) for op in mb.operators for o in op.outputs}
    inputs = set(mb.inputs)
    for op in mb.operators:
        if op.code != BO.GATHER:
            continue
        idx = op.inputs[1]
        src = index_source(idx, producers, inputs)
        table = mb.dims(op.inputs[0])
        if src is None or type_name(mb.tensors[idx].type) not in INDEX_TYPES or not table:
            continue
        axis = (getattr(op.options, "axis", 0) or 0) % len(table)
        if table[axis] >= 1:  # a dynamic table size: no static range
            yield op, src, table[axis]


def guard_indices(mb: ModelBuilder, clamp: bool = True) -> None:
    """Record each index input's valid range (``mb.index_ranges``) and, with ``clamp``, clamp
    its indices in front of every GATHER that reads them (one clamp per index tensor and size)."""
    names = dict(zip(mb.inputs, mb.input_names))
    guarded = {id(op): (src, rows) for op, src, rows in _index_gathers(mb)}
    ops, clamped = [], {}
    for op in mb.operators:
        if id(op) in guarded:
            src, rows = guarded[id(op)]
            name = names[src]
            lo, hi = mb.index_ranges.get(name, (0, rows - 1))
            mb.index_ranges[name] = (max(lo, 0), min(hi, rows - 1))
            if clamp:
                idx = op.inputs[1]
                if (idx, rows) not in clamped:
                    dtype = CIRCLE_TO_NUMPY[mb.tensors[idx].type]
                    clamped[(idx, rows)] = _clamp(mb, idx, rows, dtype, ops, op.source)
                op.inputs[1] = clamped[(idx, rows)]
        ops.append(op)
    mb.operators = ops


def problems(mb: ModelBuilder) -> list[str]:
    """The GATHERs that still read a graph input's values unclamped (what the ``index_clamps``
    step ensures when it runs)."""
    names = dict(zip(mb.inputs, mb.input_names))
    return [f"operator {mb.operators.index(op)} GATHER{op.where}: {unclamped_index_problem(names[src], rows)}"
            for op, src, rows in _index_gathers(mb)]


def _clamp(mb: ModelBuilder, idx: int, rows: int, dtype, ops: list, source: str) -> int:
    """``idx`` clamped to ``0..rows-1``. onert 0.1.0's MINIMUM/MAXIMUM have no int32 kernel
    ("Min: unsupported data type"), so the clamp runs in float32: CAST, MINIMUM, MAXIMUM, CAST.
    Exact: every int32 maps to a float that clamps to the same end, and 0..rows-1 (< 2**24)
    are exact floats."""
    info = mb.tensors[idx]
    f32 = NUMPY_TO_CIRCLE[np.dtype(np.float32)]

    def tensor(suffix, code):
        return mb.add_tensor(f"{info.name}/{suffix}", list(info.shape), code, shape_signature=info.shape_signature)

    as_float, low, high = tensor("as_float", f32), tensor("at_most_last_row", f32), tensor("clamped_float", f32)
    safe = tensor("clamped", NUMPY_TO_CIRCLE[dtype])
    upper = mb.add_constant(f"{info.name}/last_row", np.array(rows - 1, np.float32))
    zero = mb.add_constant(f"{info.name}/first_row", np.array(0, np.float32))
    for code, ins, out in ((BO.CAST, [idx], as_float), (BO.MINIMUM, [as_float, upper], low),
                           (BO.MAXIMUM, [low, zero], high), (BO.CAST, [high], safe)):
        cls = options_class_name(code)
        ops.append(OperatorInfo(code, ins, [out], make_options(cls) if cls else None, source))
    return safe


def limits_json(mb: ModelBuilder, extra: dict | None = None) -> dict:
    """The ``circle_fx.limits`` metadata of a built model (see the module docstring).
    ``extra`` adds top-level entries (``max_seq_len``) and index ranges the caller knows
    (``{"inputs": {"position": {"index_range": [0, S - 1]}}}``), which ``run`` then checks too."""
    extra = dict(extra or {})
    for name, entry in (extra.pop("inputs", None) or {}).items():
        if "index_range" in entry:
            lo, hi = entry["index_range"]
            old_lo, old_hi = mb.index_ranges.get(name, (lo, hi))
            mb.index_ranges[name] = (max(lo, old_lo), min(hi, old_hi))
    per_input: dict = {}
    for name, (lo, hi) in mb.index_ranges.items():
        per_input.setdefault(name, {})["index_range"] = [int(lo), int(hi)]
    for (name, dim), largest in sorted(mb.input_limits.items()):
        per_input.setdefault(name, {}).setdefault("max_dims", {})[str(dim)] = int(largest)
    out = {"version": 1, "inputs": per_input}
    out.update(extra)
    return out


def attach_limits(mb: ModelBuilder, extra: dict | None = None) -> None:
    """Store :func:`limits_json` in a buffer named by the model's ``circle_fx.limits`` metadata."""
    mb.limits = limits_json(mb, extra)
    data = json.dumps(mb.limits, sort_keys=True).encode()
    mb.metadata[LIMITS_METADATA] = mb.add_buffer(np.frombuffer(data, np.uint8).copy())
