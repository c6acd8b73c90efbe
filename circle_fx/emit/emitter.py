"""Lowering a :class:`Program` to a :class:`ModelBuilder`, op by op, via the registry.

Everything that can be wrong with the graph is checked up front — every op without a
lowering, every unsupported dtype — and reported together in one error, so nothing is
emitted (or written) for a graph that cannot be lowered.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..errors import CircleFxError, PassError, UnsupportedDtypeError, UnsupportedOpError
from ..fx_utils import is_noop
from ..program import Program
from ..source import op_name, source_line
from ..transformers_compat import remedies
from .builder import BO, ModelBuilder
from .context import LoweringContext
from .legalize import legalize
from .legalize.peephole import META_KEY as PEEPHOLE_KEY
from .registry import lowering_for, refusal
from .index_limits import attach_limits
from .types import TORCH_TO_CIRCLE


def check_contract(program: Program) -> None:
    """``emit``'s input contract: a canonicalized graph (``finalize_pipeline`` ends every
    pipeline with Canonicalize), so no no-op (a clone, a same-dtype cast...) is left for a
    lowering; an identity would cost onert a copy."""
    left = [n for n in program.gm.graph.nodes if is_noop(n)]
    if left:
        raise PassError("emit takes a canonicalized program (run the passes, or at least "
                        "circle_fx.passes.finalize_pipeline(), first); no-ops left: "
                        + ", ".join(f"%{n.name} ({op_name(n.target)}) at {source_line(n)}" for n in left[:10]))


def check_supported(program: Program) -> None:
    """Raise one error listing every op without a lowering, every node its lowering refuses
    (``@lowering(..., refuses=...)``, with the reason), and every bad dtype."""
    missing: list[tuple[str, str, str]] = []
    why: dict[str, str] = {}  # node name -> why its lowering refuses it
    bad_dtypes: list[str] = []
    for n in program.gm.graph.nodes:
        if n.op == "call_function" and lowering_for(n.target) is None:
            missing.append((op_name(n.target), n.name, source_line(n)))
        elif n.op == "call_function" and (reason := refusal(n)) is not None:
            missing.append((op_name(n.target), n.name, source_line(n)))
            why[n.name] = reason
        if n.op in ("placeholder", "call_function", "get_attr"):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.dtype not in TORCH_TO_CIRCLE:
                where = ("model input" if n.op == "placeholder" else
                         f"constant {n.target!r}" if n.op == "get_attr" else f"at {source_line(n)}")
                bad_dtypes.append(f"  %{n.name}: {v.dtype} {where}")
    if missing:
        by_op: dict[str, list] = {}
        for op, name, src in missing:
            by_op.setdefault(op, []).append((name, src))
        lines = [f"{len(by_op)} unsupported op(s), {len(missing)} node(s); nothing was written:"]
        for op, uses in by_op.items():
            lines.append(f"  {op}:")
            lines.extend(f"    %{name} at {src}" + (f": {why[name]}" if name in why else "") for name, src in uses)
        lines.extend(remedies(list(by_op)))
        if _has_dynamic_inputs(program):
            lines.append("  note: the model was exported with dynamic_shapes. Ops that compute from a dynamic "
                         "size are folded to constants only when shapes are static (arange, cumsum and diff over a "
                         "dynamic dim with a max are lowered): export without dynamic_shapes (one model per size), "
                         "or pass what they build (e.g. a transformers model's 4-D attention_mask) as inputs")
        raise UnsupportedOpError("\n".join(lines), missing)
    if bad_dtypes:
        raise UnsupportedDtypeError(
            "tensors with dtypes Circle cannot hold (cast the model to float32, e.g. model.float()):\n"
            + "\n".join(bad_dtypes[:20]) + ("\n  ..." if len(bad_dtypes) > 20 else ""))


def _has_dynamic_inputs(program: Program) -> bool:
    for n in program.gm.graph.nodes:
        v = n.meta.get("val") if n.op == "placeholder" else None
        if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
            return True
    return False


def emit(program: Program, progress=None, clamp_indices: bool = True) -> ModelBuilder:
    """Lower every node, in graph order. O(nodes); ``progress`` (see
    :mod:`circle_fx.progress`) is ticked once per node. ``clamp_indices``: see
    :func:`circle_fx.emit.index_limits.guard_indices` (the ``index_clamps`` legalization step)."""
    check_contract(program)
    check_supported(program)
    mb = ModelBuilder()
    ctx = LoweringContext(program, mb)
    graph: fx.Graph = program.gm.graph
    if progress is not None:
        progress.stage("emit", len(graph.nodes))
    for n in graph.nodes:
        if n.op == "placeholder":
            ctx.node = n
            idx = ctx.output(n)
            mb.inputs.append(idx)
            mb.input_names.append(n.name)
            val = n.meta.get("val")
            for d, size in enumerate(getattr(val, "shape", ())):
                bound = ctx.size_bound(size) if isinstance(size, torch.SymInt) else None
                if bound is not None:  # torch.export's Dim(max=...): the file records it
                    ctx.limit_input(n.name, d, bound)
    for n in graph.nodes:
        if progress is not None:
            progress.update()
        if n.op != "call_function":
            continue
        ctx.node = n
        try:
            lowering_for(n.target)(ctx, n)
        except CircleFxError:
            raise
        except Exception as e:  # a lowering bug: still say which node
            raise UnsupportedOpError(
                f"lowering {op_name(n.target)} (%{n.name}) at {source_line(n)} failed: "
                f"{type(e).__name__}: {e}", [(op_name(n.target), n.name, source_line(n))]) from e
    ctx.node = None
    outs = graph.output_node().args[0]
    for value, name in zip(outs, program.output_names):
        if not isinstance(value, fx.Node) or not isinstance(value.meta.get("val"), torch.Tensor):
            raise UnsupportedOpError(f"output {name!r} is {value!r}, not a tensor; Circle outputs are tensors")
        mb.outputs.append(ctx.tensor(value))
        mb.output_names.append(name)
    protected = set(mb.inputs) | set(mb.outputs)
    skip = {name for name, on in (("peephole", program.gm.meta.get(PEEPHOLE_KEY, True)),
                                  ("index_clamps", clamp_indices)) if not on}
    legalize(mb, protected, skip=skip)  # its last step gives outputs that need one a tensor of their own
    for k, (idx, name) in enumerate(zip(mb.outputs, mb.output_names)):
        tensor = mb.tensors[idx]
        if name not in mb._names and idx not in mb.outputs[:k]:  # name the tensor too (`logits`)
            mb._names.discard(tensor.name)
            tensor.name = name
            mb._names.add(name)
    attach_limits(mb, program.limits)
    return mb
