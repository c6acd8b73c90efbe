"""GPTQ on a ``torch.export``-ed graph, before PT2E annotation: what
``CircleQuantizer(weight_bits=4, gptq=True, calibration=...)`` runs in ``transform_for_annotation``.

Every ``aten.linear`` whose weight is a constant read by that linear alone and whose input is
computed (not constant) is a candidate; ``select(node)`` says which (the quantizer's 4-bit
linears). One pass over the calibration batches, interpreting the graph, accumulates the
Hessian ``X^T X`` of each candidate's input (one per input node: q/k/v share theirs). Then each
weight is replaced by its GPTQ rounding (:func:`circle_fx.quant.gptq.gptq` on the per-row
symmetric grid) and its per-row scales are returned, so the quantizer's weight observer reports
exactly those scales and ``convert_pt2e`` recovers exactly the GPTQ integers.

The Hessians come from the float model (every linear sees the float model's inputs, not those of
already-rounded earlier layers): one calibration pass instead of one per layer; TICO measured
the two within 1 % perplexity on SmolLM2-135M (its ``gptq_use_orig_model_inference``).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..program import fetch_attr
from .gptq import Hessian, gptq, symmetric_grid
from .smooth import replace_attr

aten = torch.ops.aten


def gptq_candidates(gm: fx.GraphModule, select) -> list[fx.Node]:
    """The linears GPTQ may round: a constant weight read only by this linear (rewriting a tied
    weight would change its other reader), a float input that is not a constant, and
    ``select(linear)`` true."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not aten.linear.default:
            continue
        x, w = n.args[0], n.args[1]
        if not (isinstance(w, fx.Node) and w.op == "get_attr" and len(w.users) == 1):
            continue
        if not (isinstance(x, fx.Node) and x.op != "get_attr" and isinstance(x.meta.get("val"), torch.Tensor)
                and x.meta["val"].is_floating_point()):
            continue
        if select(n):
            out.append(n)
    return out


def hessians(gm: fx.GraphModule, inputs: list[fx.Node], calibration) -> dict:
    """``X^T X`` (:class:`Hessian`) of each node in ``inputs`` over every calibration batch."""
    wanted = set(inputs)
    acc: dict[fx.Node, Hessian] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n in wanted:
                acc.setdefault(n, Hessian(out.shape[-1])).add(out)
            return out

    with torch.no_grad():
        for batch in calibration:
            Recorder(gm).run(*(batch if isinstance(batch, (tuple, list)) else (batch,)))
    return acc


def gptq_linears(gm: fx.GraphModule, calibration, select, qmin: int, qmax: int, *,
                 damp: float = 0.01, act_order: bool = True) -> dict[str, torch.Tensor]:
    """Round the weight of every candidate linear (:func:`gptq_candidates`) onto a per-row
    symmetric ``[qmin, qmax]`` grid by GPTQ over the calibration Hessians; the weights are
    replaced in ``gm`` (new tensors: never the user's storage). Returns weight attribute name ->
    its per-row scales (float32 ``[out]``)."""
    linears = gptq_candidates(gm, select)
    if not linears:
        return {}
    hs = hessians(gm, list({lin.args[0]: None for lin in linears}), calibration)
    scales = {}
    for lin in linears:
        x, w = lin.args[0], lin.args[1]
        if x not in hs:  # never reached by the calibration inputs
            continue
        weight = fetch_attr(gm, w.target)
        grid, chosen = symmetric_grid(qmin, qmax)
        rounded = gptq(weight.float(), hs[x].h, grid, damp=damp, act_order=act_order).to(weight.dtype)
        replace_attr(gm, w, lambda _old, r=rounded: r)
        scales[w.target] = chosen["groups"][0].float()
    gm.recompile()
    return scales
