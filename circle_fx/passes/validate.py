"""Checks run after every pass so that a broken pass is named, not a later lowering.

``graph.lint()`` catches structural damage (use before definition, dangling nodes). What
it cannot see is a node whose recorded ``meta["val"]`` (the shape and dtype the emitter
declares for its Circle tensor) is missing or no longer matches what the op computes —
a pass that adds a node with ``graph.call_function`` instead of ``make_node``, or that
retargets a node in place. Without this check such a graph emits a Circle file whose
declared shapes are wrong, which onert runs silently or crashes on.

The missing-meta check is cheap and runs after every pass; recomputing every node's value
on fake tensors runs only after passes that are not circle_fx's own (user passes).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..errors import PassError
from ..fx_utils import infer_val
from ..source import op_name


def is_builtin_pass(p) -> bool:
    module = getattr(p, "__module__", None) or getattr(type(p), "__module__", "")
    return module.startswith("circle_fx.")


def check_meta(program, name: str, before: set[fx.Node], deep: bool) -> None:
    graph = program.gm.graph
    for n in graph.nodes:
        if n.op not in ("call_function", "placeholder", "get_attr"):
            continue
        if "val" not in n.meta and (n not in before or deep):
            what = op_name(n.target) if n.op == "call_function" else n.op
            raise PassError(f"pass {name!r} left %{n.name} ({what}) without meta['val'] (its shape and dtype); "
                            "create nodes with circle_fx.fx_utils.make_node")
        if deep and n.op == "call_function":
            _check_recorded_value(graph, n, name)


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{v.dtype} {[str(d) for d in v.shape]}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_describe(x) for x in v) + ")"
    return type(v).__name__


def _check_recorded_value(graph: fx.Graph, n: fx.Node, name: str) -> None:
    try:
        fresh = infer_val(graph, n.target, n.args, n.kwargs)
    except Exception as e:
        raise PassError(f"pass {name!r} left %{n.name} = {op_name(n.target)} with arguments it rejects: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    recorded = n.meta.get("val")
    if _describe(fresh) != _describe(recorded):
        raise PassError(f"pass {name!r} left %{n.name} = {op_name(n.target)} recorded as {_describe(recorded)}, "
                        f"but it computes {_describe(fresh)}; update meta['val'] (make_node does this)")
