"""Linear followed by ReLU / ReLU6 -> one ``circle.linear_act`` whose Circle operators apply the
activation themselves (``fused_activation_function`` of FULLY_CONNECTED, or of the last
operator of the linear's chain: CONV_2D for the 1x1 form, the bias ADD after BATCH_MATMUL, the
MUL / ADD after a quantized weight's FULLY_CONNECTED).

``relu(linear(x))``, ``relu6`` / ``hardtanh(0, 6)`` / ``clamp(0, 6)`` / ``clamp(min=0)`` after a
linear (classifier heads, OPT's and BERT-era MLPs, MobileNet's squeeze-excite) otherwise cost
one (RELU) or two (MAXIMUM, MINIMUM) operators and a pass over the result. The fused form
computes ``min(max(y, 0), 6)`` on the same ``y``: onert applies it exactly on float, hybrid int8
and uint8 FULLY_CONNECTED and on the MUL / ADD after them; its GGML Q8_0 / Q4_0 FULLY_CONNECTED
ignores it, so that lowering puts it on an ADD (measured in ``benchmarks/onert_fc_activation.py``,
``docs/onert-findings.md``). The tests compare the fused files with the unfused ones in onert
(atol 0) and with eager.

The weight-only quantize pass (after the pipeline) reads ``circle.linear_act`` as a linear and
keeps its activation on ``circle.linear_w8`` / ``circle.linear_ggml``. A PT2E-quantized linear
is not fused: ``CircleQuantizer`` quantizes its output before the activation (``Q -> DQ``
between them), so the pattern does not match; a linear PT2E leaves float (skipped, or
``linear_outputs="float"``) fuses like any float linear.

Checks (named, for ``explain``): the result is floating point; the bounds are exactly
``(0, None)`` or ``(0, 6)`` (``clamp(0, 4)`` stays a MAXIMUM + MINIMUM); the weight is a
constant (a run-time weight goes through TRANSPOSE + BATCH_MATMUL). A linear whose result is
also read elsewhere does not match (the pattern language refuses interior nodes used outside).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..fx_utils import dtype_of, make_node, number
from ..meta import LINEAR_FORM
from ..dialect import define
from ..dialect.nhwc import ACTIVATIONS
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten


def _linear_act(x, weight, bias: Optional[torch.Tensor], activation: str):
    return ACTIVATIONS[activation](F.linear(x, weight, bias))


def _linear_act_fake(x, weight, bias, activation):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


#: ``linear_act(x, weight, bias, activation)``: ``aten.linear`` then ``activation`` (none, relu, relu6)
linear_act = define("linear_act(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor",
                    _linear_act, _linear_act_fake)


def linear_relu(x, w, b):
    return aten.relu.default(aten.linear.default(x, w, b))


def linear_clamp(x, w, b, lo, hi):
    return aten.clamp.default(aten.linear.default(x, w, b), lo, hi)


def activation_of(m) -> str | None:
    """The Circle activation the matched ReLU / clamp is, or None."""
    if "lo" not in m.bindings:
        return "relu"
    lo = number(m["lo"])
    hi = None if m["hi"] is None else number(m["hi"])
    if lo != 0 or (m["hi"] is not None and hi != 6):
        return None
    return "relu" if m["hi"] is None else "relu6"


def _check_float(m):
    dt = dtype_of(m.root)
    return None if dt is not None and dt.is_floating_point else f"the result is {dt}, not floating point"


def _check_bounds(m):
    if activation_of(m) is None:
        return f"clamp({m['lo']!r}, {m['hi']!r}) is neither ReLU (0, None) nor ReLU6 (0, 6)"
    return None


def _check_constant_weight(m):
    w = m["w"]
    if isinstance(w, fx.Node) and w.op == "get_attr":
        return None
    return (f"the weight %{getattr(w, 'name', w)} is computed at run time (TRANSPOSE + BATCH_MATMUL, "
            "which has no fused activation)")


def _linear(m) -> fx.Node:
    return next(n for n in m.nodes if n.target is aten.linear.default)


def _replace(m, g: fx.Graph):
    lin = _linear(m)
    new = make_node(g, linear_act, (m["x"], m["w"], m["b"], activation_of(m)), like=lin)
    if LINEAR_FORM in lin.meta:  # a form forced on the linear stays forced
        new.meta[LINEAR_FORM] = lin.meta[LINEAR_FORM]
    return new


RULES = [Rewrite(fn.__name__, Pattern(fn), _replace, (_check_float, _check_bounds, _check_constant_weight),
                 produces="linear_activation")
         for fn in (linear_relu, linear_clamp)]


def _clamped_linear(n: fx.Node) -> bool:
    """``explain`` candidate: a linear that an unfused ReLU / clamp reads."""
    return n.target is aten.linear.default and any(u.target in (aten.relu.default, aten.clamp.default)
                                                   for u in n.users)


FAMILY = register_family(FusionFamily(
    "linear_activation", RULES, op=linear_act,
    candidates=(Candidate(_clamped_linear, hops=1),), title="Linear+ReLU", order=40))
