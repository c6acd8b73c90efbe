"""The general fallback for ops the emitter cannot lower: decompose them into ops it can.

For every ``call_function`` whose target has no lowering (``emit.registry.lowering_for``),
or whose lowering refuses this form of it (``emit.registry.refusal``: softmax over another
axis than the last...; the form's own decomposition, ``decompositions.REFUSED_FORMS``, is
used when it is exact for the node), look up a
decomposition, in this order:

1. circle_fx's own (:mod:`circle_fx.passes.decompositions`): ops torch does not decompose
   (``gather``, ``scatter``, ``full_like``...), written in ops onert runs;
2. torch's core ATen decomposition table (``torch._decomp.core_aten_decompositions()``);
3. torch's full decomposition table (``torch._decomp.decomposition_table``);
4. the op's own CompositeImplicitAutograd body (``op.decompose``).

The decomposition is traced with ``make_fx`` on tensors shaped like the node's inputs,
itself with the same restricted table (only ops still lacking a lowering are decomposed,
recursively: ``var_mean`` inside ``native_layer_norm`` inside ``layer_norm``...). The traced
graph replaces the node **only if every op in it has a lowering**; otherwise the node is
left alone, so the unsupported-op error still names the op the user wrote, not some
internal piece of its decomposition.

Nodes that depend on no model input are skipped: constant folding evaluates them in
torch (causal masks, position ids), which is cheaper and exact.
"""
from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from ..emit.registry import lowering_for, refusal
from ..fx_utils import input_dependent, is_noop, make_node, val
from ..op_traits import IDENTITY
from ..program import add_constant
from .decompositions import REFUSED_FORMS

aten = torch.ops.aten


@functools.lru_cache(maxsize=1)
def _tables() -> list[dict]:
    """The decomposition tables, built once per process (materialising torch's core table
    takes ~2 s)."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    from .decompositions import DECOMPOSITIONS

    return [DECOMPOSITIONS, dict(core_aten_decompositions()), decomposition_table]


class _Restricted(dict):
    """The decomposition table ``make_fx`` consults (it copies it into a plain dict): every
    op of the tables that has no lowering, the earlier table winning."""

    def __init__(self, tables):
        super().__init__()
        for t in reversed(tables):
            for op, fn in t.items():
                if (isinstance(op, torch._ops.OpOverload) and lowering_for(op) is None and _takes_tensor(op)
                        and op not in IDENTITY):  # no-ops stay whole: Canonicalize removes them
                    self[op] = fn

    def lookup(self, op, node: fx.Node | None = None):
        """The decomposition for one op (for ``node``, whose form its lowering may refuse):
        from the tables, else its CompositeImplicit body."""
        if node is not None and _refused(node):
            form = REFUSED_FORMS.get(op)
            return form[1] if form is not None and form[0](node) else None
        if not isinstance(op, torch._ops.OpOverload) or lowering_for(op) is not None:
            return None
        fn = self.get(op)
        if fn is None and op._can_decompose():
            fn = op.decompose
        return fn


def _refused(n: fx.Node) -> bool:
    """``n``'s op has a lowering that refuses this form of it."""
    return refusal(n) is not None


def _unlowered(n: fx.Node) -> bool:
    """Needs a decomposition: no lowering, or a refused form (a no-op needs neither:
    Canonicalize, which follows this pass in every pipeline, removes it)."""
    return n.op == "call_function" and not is_noop(n) and (lowering_for(n.target) is None or _refused(n))


def _takes_tensor(op) -> bool:
    """Factories (``full``, ``arange``, ``empty``...) take no tensor: they only ever build
    constants, which folding evaluates; decomposing them only loops through ``fill``."""
    return any(isinstance(a.type, torch.TensorType) or "Tensor" in str(a.type) for a in op._schema.arguments)



def _static(v) -> bool:
    return isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape)


def _trace(node: fx.Node, table: _Restricted) -> fx.GraphModule | None:
    """``node``'s op, decomposed and traced on example tensors of its inputs' shapes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = list(node.all_input_nodes)
    if not all(_static(val(i)) for i in inputs) or not _outputs_static(node):
        return None  # traced shapes would be baked in; dynamic dims stay unsupported
    fn = table.lookup(node.target, node)
    if fn is None:
        return None

    def run(*tensors):
        env = dict(zip(inputs, tensors))
        args = map_arg(node.args, env.__getitem__)
        kwargs = map_arg(node.kwargs, env.__getitem__)
        return fn(*args, **kwargs)

    # the inputs' own strides: a decomposition traced on contiguous examples may ``view`` what
    # is, in the graph, a permuted (non-contiguous) tensor (Mamba-2's chunked einsums)
    examples = [torch.empty_strided(val(i).shape, val(i).stride(), dtype=val(i).dtype).zero_() for i in inputs]
    try:
        return make_fx(run, decomposition_table=table, tracing_mode="fake")(*examples)
    except Exception:
        return None  # the decomposition does not apply to these arguments: keep the op


def _outputs_static(node) -> bool:
    v = val(node)
    vs = v if isinstance(v, (tuple, list)) else (v,)
    return all(_static(x) for x in vs)


def _lowerable(gm: fx.GraphModule) -> bool:
    """Every op that computes from the inputs has a lowering (the others fold to constants,
    no-ops such as a traced ``clone`` / ``contiguous`` are canonicalized away);
    a form its lowering refuses counts (the next round decomposes it: ``pad`` gives RWKV's
    cropping ``constant_pad_nd``)."""
    live = input_dependent(gm.graph)
    return not any(n in live and n.op == "call_function" and lowering_for(n.target) is None and not is_noop(n)
                   for n in gm.graph.nodes)


def _inline(program, node: fx.Node, gm: fx.GraphModule) -> bool:
    """Replace ``node`` by ``gm``'s graph; False (graph untouched) if the result does not
    have the node's shapes and dtypes."""
    g = program.gm.graph
    inputs = list(node.all_input_nodes)
    env: dict[fx.Node, object] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs))
    added: list[fx.Node] = []
    result = None
    with g.inserting_before(node):
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                t = getattr(gm, n.target)
                name = add_constant(program.gm, t.detach().clone(), f"{node.name}_const")
                c = g.get_attr(name)
                c.meta["val"] = t
                env[n] = c
                added.append(c)
            elif n.op == "call_function":
                new = make_node(g, n.target, map_arg(n.args, env.__getitem__), map_arg(n.kwargs, env.__getitem__),
                                like=node)
                env[n] = new
                added.append(new)
            elif n.op == "output":
                result = map_arg(n.args[0], lambda a: env[a])
    ok = _same_meta(val(node), result)
    if not ok:
        for n in reversed(added):
            if not n.users:
                g.erase_node(n)
        return False
    if isinstance(result, (tuple, list)):
        for user in list(node.users):  # tuple results are read through getitem
            if user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                g.erase_node(user)
        if node.users:
            return False
    else:
        node.replace_all_uses_with(result)
    g.erase_node(node)
    return True


def _same_meta(v, result) -> bool:
    if isinstance(v, (tuple, list)):
        return (isinstance(result, (tuple, list)) and len(v) == len(result)
                and all(_same_meta(a, b) for a, b in zip(v, result)))
    if not isinstance(result, fx.Node):
        return False
    r = val(result)
    return isinstance(r, torch.Tensor) and r.dtype == v.dtype and tuple(r.shape) == tuple(v.shape)


def _key(node: fx.Node):
    """Nodes with equal keys decompose to the same graph (a model repeats its layers)."""
    def describe(a):
        if isinstance(a, fx.Node):
            v = val(a)
            return ("T", tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else ("?", id(a))
        return a

    try:
        key = (node.target, repr(map_arg(node.args, describe)), repr(map_arg(node.kwargs, describe)),
               tuple(node.all_input_nodes).__len__())
        order = [node.all_input_nodes.index(a) for a in _flat_nodes(node.args, node.kwargs)]
        return key + (tuple(order),)
    except Exception:
        return None


def _flat_nodes(args, kwargs) -> list:
    out: list = []
    map_arg((args, kwargs), lambda a: out.append(a))
    return out


def decompose_unlowered(program, max_rounds: int = 4, defer=frozenset()) -> bool:
    """Decompose every input-dependent node without a lowering, except those whose op is in
    ``defer`` (left for a later decompose); True if the graph changed."""
    live = input_dependent(program.gm.graph)
    if not any(n in live and n.target not in defer and _unlowered(n) for n in program.gm.graph.nodes):
        return False  # the common case: every op lowers, no table needed
    table = _Restricted(_tables())
    cache: dict = {}
    changed = False
    for _ in range(max_rounds):
        g = program.gm.graph
        live = input_dependent(g)
        round_changed = False
        for n in list(g.nodes):
            if n not in live or n.target in defer or not _unlowered(n):
                continue
            key = _key(n)
            if key is None or key not in cache:
                gm = _trace(n, table)
                gm = gm if gm is not None and _lowerable(gm) else None
                if key is not None:
                    cache[key] = gm
            else:
                gm = cache[key]
            if gm is None:
                continue
            round_changed |= _inline(program, n, gm)
        changed |= round_changed
        if not round_changed:
            break
    return changed
