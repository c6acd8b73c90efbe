"""Graph outputs onert 0.1.0 returns wrongly, given a tensor of their own (the ``output_copies`` step).

onert reuses the memory of a graph output that later operators also read, and returns a later
operator's result in it (``circle/limits.output_read_problem``, measured; docs/onert-findings.md).
So an output that is read by an operator, that is already another output, or that no operator
writes (a graph input, a constant) is written by a RESHAPE of its own after every other
operator (a CAST when two dims are dynamic: RESHAPE infers one). ``mb.outputs`` is replaced in
place; naming the outputs is the emitter's job, after this step.
"""
from __future__ import annotations

import numpy as np

from ...circle.limits import OUTPUT_COPIES, output_read_problem, tail_start
from ..builder import BO, ModelBuilder

__all__ = ["OUTPUT_COPIES", "copy_outputs", "problems"]


def _needs_copy(mb: ModelBuilder, k: int, idx: int, read: set, written: set) -> str | None:
    if idx in read:
        return output_read_problem([n for n, op in enumerate(mb.operators) if idx in op.inputs])
    if idx in mb.outputs[:k]:
        return "already an earlier output"
    if idx not in written:
        return "written by no operator (a graph input or a constant)"
    return None


def copy_outputs(mb: ModelBuilder, protected: set) -> int:
    """Give every output :func:`_needs_copy` names a tensor of its own; return how many."""
    read = {i for op in mb.operators for i in op.inputs}
    written = {o for op in mb.operators for o in op.outputs}
    copied = 0
    for k, idx in enumerate(list(mb.outputs)):
        if _needs_copy(mb, k, idx, read, written):
            mb.outputs[k] = _output_copy(mb, idx)
            protected.add(mb.outputs[k])
            copied += 1
    return copied


def problems(mb: ModelBuilder) -> list[str]:
    """The graph outputs that still break the limit after :func:`copy_outputs`: read by an
    operator before the trailing output writers (the copies read what they copy), or written by
    none."""
    tail = tail_start([op.outputs for op in mb.operators], set(mb.outputs))
    read = {i for op in mb.operators[:tail] for i in op.inputs}
    written = {o for op in mb.operators for o in op.outputs}
    out = []
    for k, idx in enumerate(mb.outputs):
        if idx in read:
            why = output_read_problem([n for n, op in enumerate(mb.operators[:tail]) if idx in op.inputs])
        else:
            why = None if idx in written else "written by no operator (a graph input or a constant)"
        if why:
            out.append(f"graph output {k} {mb.tensors[idx].name!r}: {why}")
    return out


def _output_copy(mb: ModelBuilder, idx: int) -> int:
    t = mb.tensors[idx]
    out = mb.add_tensor(f"{t.name}_out", t.shape, t.type, 0, t.shape_signature)
    shape = mb.dims(idx)
    if shape.count(-1) > 1:
        mb.add_operator(BO.CAST, [idx], [out])  # RESHAPE could infer only one dynamic dim
    else:
        mb.add_operator(BO.RESHAPE, [idx, mb.add_constant(f"{t.name}_out/shape", np.array(shape, np.int32))], [out])
    return out
