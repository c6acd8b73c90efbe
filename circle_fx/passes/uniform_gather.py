"""A gather from a constant whose elements are all equal -> that value, in the index's shape.

BERT-style embeddings (RoBERTa, X-MOD, ...) read default token types as
``torch.gather(self.token_type_ids[:, :S].expand(B, S), 1, position_ids)`` when the caller
passes none: a run-time index into a buffer of zeros. At batch 1 that is one GATHER, but at
batch > 1 it needs ``decompositions.gather``'s one-hot sum, in int64, which onert 0.1.0 has
no kernel for, so the whole model was refused. Every element of the source is the same value,
so the result is that value wherever the index points (an index out of range would raise in
eager; here it reads the same value). The rewrite gives an input-free ``full``, which
constant folding turns into a constant.

The source is evaluated only when it depends on no model input and is small (a chain of
views of a buffer); a larger or input-dependent source is left to the general decomposition.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import make_node, static_shape, val
from ..patterns import Match, Rewrite, op_pattern
from ..program import fetch_attr

aten = torch.ops.aten

#: sources above this many elements are not evaluated (the buffers in question are [1, max_positions])
_LIMIT = 1 << 16


def _value(n, depth: int = 0):
    """The value of an input-free node made of a parameter or buffer and ops on it; None otherwise."""
    if not isinstance(n, fx.Node):
        return n
    if depth > 8 or n.op == "placeholder":
        return None
    if n.op == "get_attr":
        t = fetch_attr(n.graph.owning_module, n.target)
        return t if isinstance(t, torch.Tensor) and t.numel() <= _LIMIT else None
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return None
    missing = object()

    def ev(a):
        v = _value(a, depth + 1) if isinstance(a, fx.Node) else a
        return missing if v is None else v

    args = fx.map_arg(n.args, ev)
    kwargs = fx.map_arg(n.kwargs, ev)
    flat = list(args) + [x for a in args if isinstance(a, (list, tuple)) for x in a] + list(kwargs.values())
    if any(a is missing for a in flat):
        return None
    with torch.no_grad():
        return n.target(*args, **kwargs)


def _uniform_value(n: fx.Node):
    """The one value every element of the gather's (static, input-free, small) source holds, or None."""
    if static_shape(n) is None:
        return None
    src = _value(n.args[0])
    if not isinstance(src, torch.Tensor) or src.numel() == 0:
        return None
    first = src.reshape(-1)[0]
    return first if bool((src == first).all()) else None


def uniform_constant_source(m: Match) -> str | None:
    """The rule's form (its only check: any other gather is no near miss of it)."""
    return None if _uniform_value(m.root) is not None else "the source is not a small constant of one value"


def uniform_gather(m: Match, g: fx.Graph) -> fx.Node:
    """The replacement: ``full`` of that value in the gather's shape (constant folding makes it a constant)."""
    n = m.root
    first = _uniform_value(n)
    return make_node(g, aten.full.default, (list(static_shape(n)), first.item()), {"dtype": val(n).dtype}, like=n)


UNIFORM_GATHER = Rewrite("uniform_gather", op_pattern(aten.gather.default, "uniform_gather"), uniform_gather,
                         (uniform_constant_source,), "a constant")
