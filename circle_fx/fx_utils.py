"""Small FX helpers shared by passes, the matcher and the emitter.

- :func:`arguments` gives an op's arguments in schema order with defaults filled, so
  code never has to care whether ``keepdim`` came positionally or as a keyword.
- :func:`make_node` inserts a node and computes its ``meta["val"]`` by running the op on
  fake tensors, so shapes and dtypes stay known after every rewrite.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.node import map_arg

from .op_traits import CAST, IDENTITY

aten = torch.ops.aten


def val(node: Any):
    """The fake tensor (or python value) a node produces; literals pass through."""
    if isinstance(node, fx.Node):
        return node.meta.get("val")
    return node


def dtype_of(node: Any):
    v = val(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def shape_of(node: Any) -> tuple | None:
    v = val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def same_size(a, b) -> bool:
    """Two sizes (ints or SymInts) are the same expression."""
    return (a.node.expr if isinstance(a, torch.SymInt) else a) == (b.node.expr if isinstance(b, torch.SymInt) else b)


def static_shape(node: Any) -> tuple[int, ...] | None:
    """Shape as plain ints, or ``None`` when any dim is symbolic."""
    s = shape_of(node)
    if s is None:
        return None
    try:
        return tuple(int(d) for d in s) if all(isinstance(d, int) for d in s) else None
    except TypeError:
        return None


def arguments(node: fx.Node) -> list:
    """All schema arguments of a call_function node, positionally, defaults filled."""
    spec = _arg_spec(node.target)
    if spec is None:
        return list(node.args) + list(node.kwargs.values())
    args, kwargs = node.args, node.kwargs
    n = len(args)
    return [args[i] if i < n else kwargs[name] if name in kwargs
            else list(default) if type(default) is list else default  # a caller may change its copy
            for i, (name, default) in enumerate(spec)]


#: target -> ((argument name, default or None), ...) from its schema
_ARG_SPECS: dict = {}


def _arg_spec(target) -> tuple | None:
    """The schema's argument names and defaults, read once per op: ``schema.arguments`` builds
    new Python objects on every access, and the matcher asks for them at every candidate."""
    try:
        return _ARG_SPECS[target]
    except KeyError:
        pass
    except TypeError:  # an unhashable target
        return None
    schema = getattr(target, "_schema", None)
    spec = None if schema is None else tuple(
        (a.name, a.default_value if a.has_default_value() else None) for a in schema.arguments)
    _ARG_SPECS[target] = spec
    return spec


def is_noop(node: fx.Node) -> bool:
    """True for casts to the same dtype, aliases, clones: values equal to their input."""
    if node.op != "call_function":
        return False
    if node.target in IDENTITY:
        if node.target is aten.dropout.default:
            return not arguments(node)[2]  # dropout with train=False is the identity
        return True
    if node.target in CAST:
        src = node.args[0]
        return isinstance(src, fx.Node) and dtype_of(src) == dtype_of(node) and dtype_of(node) is not None
    return False


def look_through(value: Any) -> Any:
    """Follow no-op nodes back to the value they pass on."""
    while isinstance(value, fx.Node) and is_noop(value):
        value = value.args[0]
    return value


def strip_casts(value: Any) -> Any:
    """``value`` with every dtype conversion (and no-op) in front of it removed."""
    value = look_through(value)
    while isinstance(value, fx.Node) and value.op == "call_function" and value.target in CAST:
        value = look_through(value.args[0])
    return value


_FAKE_MODES: "weakref.WeakKeyDictionary[fx.Graph, Any]" = weakref.WeakKeyDictionary()


def fake_mode_of(graph: fx.Graph, args: tuple = (), kwargs: dict | None = None):
    """The graph's fake mode, from the given inputs' values when one of them is fake
    (O(arguments)); otherwise from one scan of the graph, cached per graph, so that a
    pass creating k nodes costs O(k + nodes), not O(k x nodes)."""
    fakes = []
    map_arg((args, kwargs or {}), lambda n: fakes.append(n.meta.get("val")))
    fakes = [v for v in fakes if isinstance(v, torch._subclasses.FakeTensor)]
    if fakes:
        return detect_fake_mode(fakes)
    if graph not in _FAKE_MODES:
        vals = [n.meta.get("val") for n in graph.nodes if n.op in ("placeholder", "call_function")]
        _FAKE_MODES[graph] = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return _FAKE_MODES[graph]


#: per graph: the memo dicts of :func:`graph_cache`
_GRAPH_CACHES: "weakref.WeakKeyDictionary[fx.Graph, dict]" = weakref.WeakKeyDictionary()


def graph_cache(graph: fx.Graph, kind: str) -> dict:
    """The memo ``kind`` of ``graph`` (fake values shared by its nodes), gone with the graph.

    Keyed by the graph, not by its fake mode: the values are fake tensors, which refer to their
    mode, so in a ``WeakKeyDictionary`` keyed by the mode each entry kept its own key alive, and
    every export's FakeTensorMode and cached fake values stayed in memory for good. Nor stored on
    the mode: that cycle runs through tensors, which the garbage collector does not break
    (measured: still one mode more per export). Nothing of the mode refers to the graph, so the
    entry goes with the graph (``tests/passes/test_infer_val.py``). One Program has one graph
    for all its passes, so the memo is shared as widely as before."""
    return _GRAPH_CACHES.setdefault(graph, {}).setdefault(kind, {})


def fake_constant(graph: fx.Graph, tensor: torch.Tensor):
    """The ``meta["val"]`` of a new constant ``tensor`` in ``graph``: a fake tensor with static
    dims (like the captured weights'; under the export's shape env ``from_tensor`` would
    otherwise make them symbolic), or ``tensor`` itself when the graph has no fake mode.

    Shared by every constant of one dtype, shape and strides, as :func:`infer_val` shares
    equal results: a pass adding one constant per layer (merged weights, index tables) paid a
    fake-tensor conversion for each, now one per distinct layout. Made from an uninitialised
    tensor of that layout, so the constant's data is never read (a lazily stacked weight is
    not concatenated)."""
    mode = fake_mode_of(graph)
    if mode is None:
        return tensor
    key = (tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.device.type)
    cache = graph_cache(graph, "constants")  # (dtype, shape, strides, device) -> fake value
    if key not in cache:
        like = torch.empty_strided(key[1], key[2], dtype=tensor.dtype, device=tensor.device)
        cache[key] = mode.from_tensor(like, static_shapes=True)
    return cache[key]


class _Uncacheable(Exception):
    pass


def _signature(x: Any):
    """What a fake evaluation's result depends on: tensors by dtype, shape, strides and
    offset (static ints only), Python scalars and lists by value; anything else (a SymInt,
    an object) makes the call uncacheable."""
    if isinstance(x, torch.Tensor):
        shape, stride = tuple(x.shape), tuple(x.stride())
        if not all(type(d) is int for d in shape + stride):
            raise _Uncacheable
        return ("T", x.dtype, shape, stride, x.storage_offset(), x.device.type, x.requires_grad)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, *(_signature(v) for v in x))
    if isinstance(x, dict):
        return ("dict", *((k, _signature(v)) for k, v in sorted(x.items())))
    if x is None or type(x) in (int, float, bool, str) or isinstance(x, (torch.dtype, torch.device,
                                                                        torch.memory_format, torch.layout)):
        return (type(x).__name__, x)
    raise _Uncacheable


def infer_val(graph: fx.Graph, target, args: tuple, kwargs: dict):
    """Run ``target`` on the fake values of its inputs to get the output's fake value.

    Memoized per graph (:func:`graph_cache`) on the inputs' dtypes, static shapes and strides
    and the other arguments' values: a model's layers repeat the same ops on the same shapes, and a fake
    evaluation (torch's dispatch, cache-key hashing, a new FakeTensor) costs far more than
    the lookup. Nodes with equal signatures then share one (read-only) fake value.
    """
    mode = fake_mode_of(graph, args, kwargs)
    key = None
    if mode is not None:
        try:
            key = (target, _signature(map_arg(args, lambda n: n.meta.get("val"))),
                   _signature(map_arg(kwargs, lambda n: n.meta.get("val"))))
            hash(key)
        except (_Uncacheable, TypeError):
            key = None
        if key is not None:
            cached = graph_cache(graph, "values").get(key)  # (target, input signature) -> fake value
            if cached is not None:
                return type(cached)(cached) if type(cached) in (list, tuple) else cached
    result = _evaluate(mode, target, args, kwargs)
    if key is not None and _shareable(result):
        graph_cache(graph, "values")[key] = result
    return result


def _shareable(result) -> bool:
    """May nodes with equal input signatures share ``result``? Only plain results: not one
    with a data-dependent (unbacked) size, which would tell the shape env that two
    ``nonzero`` counts are equal, and not a view, whose ``_base`` and storage are the first
    node's input."""
    values = result if isinstance(result, (list, tuple)) else (result,)
    return bool(values) and all(
        isinstance(v, torch.Tensor) and v._base is None
        and all(type(d) is int for d in (*v.shape, *v.stride())) for v in values)


def _evaluate(mode, target, args: tuple, kwargs: dict):

    def to_fake(n):
        v = n.meta.get("val")
        if mode is not None and isinstance(v, torch.Tensor) and not isinstance(v, torch._subclasses.FakeTensor):
            v = mode.from_tensor(v)
        return v

    fargs = map_arg(args, to_fake)
    fkwargs = map_arg(kwargs, to_fake)
    if mode is None:
        return target(*fargs, **fkwargs)
    with mode:
        return target(*fargs, **fkwargs)


def make_node(graph: fx.Graph, target, args: tuple, kwargs: dict | None = None,
              like: fx.Node | None = None) -> fx.Node:
    """Insert ``target(*args)`` at the graph's insertion point with its meta computed.

    ``like`` lends its stack trace, so errors and reports on the new node still point at
    the user's source line. Cost: one fake-tensor evaluation of ``target``, O(arguments)
    graph work (see :func:`fake_mode_of`), never a scan of the graph per node.
    """
    kwargs = kwargs or {}
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = infer_val(graph, target, args, kwargs)
    if like is not None:
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in like.meta:
                node.meta[key] = like.meta[key]
    return node


def erase_unused(graph: fx.Graph, nodes) -> None:
    """Erase those of ``nodes`` (a small set, any order) left without users."""
    pending = [n for n in dict.fromkeys(nodes)
               if n.op not in ("placeholder", "output") and not getattr(n, "_erased", False)]
    progress = True
    while progress and pending:
        progress = False
        for n in list(pending):
            if not n.users:
                graph.erase_node(n)
                pending.remove(n)
                progress = True


def input_dependent(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose value depends on a model input (the rest are constants that folding evaluates)."""
    live: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder" or any(i in live for i in n.all_input_nodes):
            live.add(n)
    return live


def is_float(value: Any) -> bool:
    """Is ``value`` (a node or tensor) of a floating dtype?"""
    dt = dtype_of(value)
    return dt is not None and dt.is_floating_point


def number(v: Any) -> float | None:
    """``v`` as a float when it is a Python int or float literal (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def scaled_operand(node: fx.Node) -> tuple[Any, float | None]:
    """``(x, k)`` for ``x * k``, ``k * x`` or ``x / k`` with a literal number ``k`` (None if not)."""
    x, k = node.args[0], number(node.args[1])
    if node.target is torch.ops.aten.mul.Tensor and k is None:
        x, k = node.args[1], number(node.args[0])
    return x, k


def keep_if_like(graph: fx.Graph, node: fx.Node, new: fx.Node, *made: fx.Node) -> fx.Node | None:
    """``new`` if it has ``node``'s dtype and shape (a rewrite must not change either), else
    erase ``new`` and the helper nodes ``made`` for it (users first) and return None."""
    if dtype_of(new) == dtype_of(node) and shape_of(new) == shape_of(node):
        return new
    for m in (new, *made):
        graph.erase_node(m)
    return None
