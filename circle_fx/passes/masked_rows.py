"""Per-row dispatch through a boolean mask -> the row computation on every row, then a select.

X-MOD's per-language adapters are written ``out[mask] = adapter(h[mask])``: ``h[mask]`` keeps a
number of rows known only at run time (``nonzero``), and ``index_put`` writes the adapter's
rows back in place. The same shape appears as ``y[mask] += v`` (an ``index`` then an
``index_put`` with ``accumulate``). Neither has a static-shape form in Circle, but when the
computation between them treats every selected row on its own (it only works within a row:
linears, elementwise ops with weights that broadcast over the row's trailing dims, a layer norm
or softmax inside the row), computing it on *every* row and keeping the selected ones gives
the same values:

    index_put(base, [mask], f(index(src, [mask])))  ==  where(mask, f(src), base)

(``base + f(src)`` in the ``where`` for ``accumulate``). The cost is ``f`` on every row instead
of the selected ones (X-MOD: each language's adapter runs on the whole batch). A chain with
any other op (a reshape naming the run-time row count, a reduction across rows...) is left
alone: the error names the boolean-mask read (or ``index_put``). A mask whose values broadcast over the
selected positions (no run-time row count) is ``decompositions.index_put``'s.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import make_node, static_shape, val
from ..op_traits import ELEMENTWISE, IDENTITY, SOFTMAX
from ..patterns import Match, Rewrite, op_pattern
from ..source import op_name

aten = torch.ops.aten


def _mask_of(indices) -> tuple[int, fx.Node] | None:
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or not isinstance(given[0][1], fx.Node):
        return None
    m = val(given[0][1])
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or static_shape(m) is None:
        return None
    return given[0]


def _row_wise(n: fx.Node, rows: set, p: int) -> bool:
    """``n`` computes each row (index ``p`` of its row inputs) from that row alone: its
    other tensor operands depend on no row and broadcast only over the dims after ``p``."""
    rank = len(val(n).shape)
    inner = rank - p - 1  # dims after the row dim

    def outside_ok(a) -> bool:
        if not isinstance(a, fx.Node):
            return True
        if a in rows:
            return True
        v = val(a)
        return not isinstance(v, torch.Tensor) or (static_shape(a) is not None and v.dim() <= inner)

    t = n.target
    if t in ELEMENTWISE or t in IDENTITY:
        return all(outside_ok(a) for a in n.args) and all(outside_ok(a) for a in n.kwargs.values())
    if t is aten.linear.default:
        return inner >= 1 and n.args[0] in rows and all(a not in rows and _weight(a) for a in n.args[1:])
    if t is aten.layer_norm.default:
        return (n.args[0] in rows and len(n.args[1]) <= inner
                and all(a is None or (a not in rows and outside_ok(a)) for a in n.args[2:4]))
    if t in SOFTMAX:
        return n.args[0] in rows and n.args[1] % rank > p
    return False


def _weight(a) -> bool:
    """A linear's weight or bias: a static tensor that is not a row (or no bias)."""
    return a is None or (isinstance(a, fx.Node) and static_shape(a) is not None)


def masked_write(m: Match) -> str | None:
    """The rule's form: a write through one static boolean mask of values whose row count is
    known only at run time (a mask whose values broadcast is ``decompositions.index_put``'s)."""
    values = m.root.args[2]
    if _mask_of(m.root.args[1]) is None or not isinstance(values, fx.Node) or static_shape(values) is not None:
        return "not a write of rows selected by a boolean mask"
    return None


def _chain(n: fx.Node):
    """The nodes from the ``src[mask]`` reads to ``n``'s values (every node of run-time row
    count) and the reads' sources, or the node that breaks the chain."""
    p, mask = _mask_of(n.args[1])
    rows: set[fx.Node] = set()
    sources: dict[fx.Node, fx.Node] = {}
    stack = [n.args[2]]
    while stack:
        v = stack.pop()
        if v in rows:
            continue
        if v.op != "call_function" or static_shape(v) is not None:
            return v
        rows.add(v)
        if (v.target is aten.index.Tensor and _mask_of(v.args[1]) == (p, mask)
                and static_shape(v.args[0]) is not None):
            sources[v] = v.args[0]
            continue
        for a in v.all_input_nodes:
            if static_shape(a) is None:  # of the run-time row count too: a node of the chain
                if a.op != "call_function":
                    return a
                stack.append(a)
    return rows, sources


def read_through_the_same_mask(m: Match) -> str | None:
    """The values are computed from rows read through the same mask (``src[mask]``)."""
    found = _chain(m.root)
    if isinstance(found, fx.Node):
        return f"%{found.name}'s row count is known only at run time, but it is no read through the same mask"
    return None if found[1] else "no value is read through the same mask"


def row_wise(m: Match) -> str | None:
    """Every op between the reads and the write computes each row from that row alone."""
    rows, sources = _chain(m.root)
    p = _mask_of(m.root.args[1])[0]
    for v in m.root.graph.nodes:
        if v in rows and v not in sources and not _row_wise(v, rows, p):
            return f"%{v.name} ({op_name(v.target)}) mixes rows, or its other operands vary per row"
    return None


def masked_rows(m: Match, g: fx.Graph) -> fx.Node | None:
    """The replacement (see the module doc); None when the rebuilt rows do not have the
    written tensor's shape."""
    n = m.root
    base, indices, values = n.args[0], n.args[1], n.args[2]
    accumulate = bool(n.args[3]) if len(n.args) > 3 else bool(n.kwargs.get("accumulate", False))
    p, mask = _mask_of(indices)
    rows, sources = _chain(n)
    order = [v for v in g.nodes if v in rows and v not in sources]
    # the same computation on every row (the sources themselves instead of their selections)
    env = dict(sources)
    for v in order:
        args = fx.map_arg(v.args, lambda a: env.get(a, a))
        kwargs = fx.map_arg(v.kwargs, lambda a: env.get(a, a))
        if v.target in SOFTMAX:  # counted from the end: the mask's dims replaced one row dim
            args = (args[0], args[1] % len(val(v).shape) - len(val(v).shape), *args[2:])
        env[v] = make_node(g, v.target, args, kwargs, like=v)
    full = env[values]
    shape = list(val(base).shape)
    if list(val(full).shape) != shape:
        return None
    m_val = val(mask)
    keep = make_node(g, aten.reshape.default,
                     (mask, [1] * p + list(m_val.shape) + [1] * (len(shape) - p - m_val.dim())), like=n)
    if accumulate:
        full = make_node(g, aten.add.Tensor, (base, full), like=n)
    return make_node(g, aten.where.self, (keep, full, base), like=n)


MASKED_ROWS = Rewrite("masked_rows", op_pattern(aten.index_put.default, "masked_rows"), masked_rows,
                      (masked_write, read_through_the_same_mask, row_wise), "a select over every row")
