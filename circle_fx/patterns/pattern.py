"""The pattern language: a pattern is a plain Python function of ``torch.ops`` calls,
traced once with ``torch.fx`` into a small graph.

- Function parameters are *wildcards*: each binds to whatever value sits there in the
  target graph (a node or a literal such as ``eps``); a parameter used twice must bind to
  the same value both times (that is how ``x * rsqrt(mean(x**2))`` insists on one ``x``).
- Literals in the function (``2``, ``None``) must match exactly.
- :func:`optional_cast` marks a place where a dtype conversion may or may not appear;
  :func:`moved` one where any chain of data-movement ops may appear.

Conditions that are not about shape of the graph (is the axis the last one? is the
weight 1-D?) are ordinary Python checks attached to a :class:`~circle_fx.patterns.rewrite.Rewrite`.
"""
from __future__ import annotations

from typing import Callable

import torch.fx as fx


def optional_cast(x):
    """Pattern marker: ``x``, or ``x`` converted to another dtype (``to``/``_to_copy``)."""
    if isinstance(x, fx.Proxy):
        return x.tracer.create_proxy("call_function", optional_cast, (x,), {})
    return x


def moved(x):
    """Pattern marker: ``x``, or ``x`` after any chain of data-movement ops (view, reshape,
    transpose, permute, unsqueeze, squeeze, expand; ``op_traits.MOVEMENT``), which the
    match covers. Longer chains are tried first. What the chain does to the layout is for a
    rule check to judge (e.g. SmoothQuant's channel map, ``circle_fx/quant/smooth_rules.py``)."""
    if isinstance(x, fx.Proxy):
        return x.tracer.create_proxy("call_function", moved, (x,), {})
    return x


class Pattern:
    """A traced pattern function: ``graph``, its wildcard names, and its root node."""

    def __init__(self, fn: Callable, name: str | None = None, graph: fx.Graph | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.graph = fx.symbolic_trace(fn).graph if graph is None else graph
        self.params = [n.target for n in self.graph.nodes if n.op == "placeholder"]
        root = self.graph.output_node().args[0]
        if not isinstance(root, fx.Node) or root.op != "call_function":
            raise ValueError(f"pattern {self.name} must return the result of one op call")
        self.root = root
        self.size = sum(1 for n in self.graph.nodes if n.op == "call_function")

    def __repr__(self) -> str:
        return f"<Pattern {self.name}: {self.size} ops rooted at {self.root.target}>"


def op_pattern(target, name: str | None = None) -> Pattern:
    """A one-op pattern: ``target`` with every schema argument a wildcard (named as in the
    schema). For rules whose conditions are all about the node and its neighbourhood (an
    index list, a chain of row-wise ops), which a traced function cannot spell; the rule's
    named checks say the rest."""
    g = fx.Graph()
    args = tuple(g.placeholder(a.name) for a in target._schema.arguments)
    root = g.call_function(target, args)
    g.output(root)

    def one_op(*xs):  # the function the pattern stands for
        return target(*xs)

    one_op.__name__ = name or str(target)
    return Pattern(one_op, name, graph=g)


def pattern(fn: Callable) -> Pattern:
    """Decorator form: ``@pattern def rms(x, eps): ...`` makes ``rms`` a :class:`Pattern`."""
    return Pattern(fn)
