"""GELU, tanh approximation, written out by hand -> one ``aten.gelu(x, approximate="tanh")``
-> one Circle ``GELU`` (``approximate=True``).

GPT-2's ``NewGELUActivation`` (transformers' ``gelu_new``, also GPT-J, CodeGen, Phi-1) and
``FastGELUActivation`` (``gelu_fast``) spell the formula with elementwise ops:

    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))        # gelu_new
    0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))  # gelu_fast

which export (after canonicalization) as 8-9 Circle ops per MLP; onert runs GELU with
``approximate=True`` as one kernel, measured to match the formula to 4.6e-7
(docs/onert-findings.md; ``benchmarks/gelu_tanh_forms.py`` prints the op counts and
timings). The fused op is torch's own ``aten.gelu``, which already has an eager kernel, a
fake kernel and a lowering, so this family adds no op of its own.

Checks (named, for ``explain``): the input is floating point, and the constants are the
formula's (0.5, sqrt(2/pi) to 1e-6 relative — ``gelu_fast`` writes it with 10 digits —,
0.044715, exponent 3): a different coefficient is a different function and stays
decomposed.
"""
from __future__ import annotations

import math

import torch

from ..fx_utils import dtype_of, make_node, number
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x, half, inner):
    """``(x * half) * (tanh(inner) + 1)`` (mul and add are matched commutatively)."""
    return aten.mul.Tensor(aten.mul.Tensor(x, half), aten.add.Tensor(aten.tanh.default(inner), 1.0))


def gelu_new(x, half, k, c, three):
    """``0.5*x*(1 + tanh(k * (x + c * x**3)))``"""
    inner = aten.mul.Tensor(aten.add.Tensor(x, aten.mul.Tensor(aten.pow.Tensor_Scalar(x, three), c)), k)
    return _gelu(x, half, inner)


def gelu_fast(x, half, k, c):
    """``0.5*x*(1 + tanh(x*k * (1 + c*x*x)))``"""
    inner = aten.mul.Tensor(aten.mul.Tensor(x, k), aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(x, c), x), 1.0))
    return _gelu(x, half, inner)


def gelu_new_half_last(x, half, k, c, three):
    """``x*(1 + tanh(k * (x + c * x**3))) * 0.5`` (the half applied last)"""
    inner = aten.mul.Tensor(aten.add.Tensor(x, aten.mul.Tensor(aten.pow.Tensor_Scalar(x, three), c)), k)
    return aten.mul.Tensor(aten.mul.Tensor(x, aten.add.Tensor(aten.tanh.default(inner), 1.0)), half)


# --------------------------------------------------------------------------- checks

def _check_float(m):
    dt = dtype_of(m["x"])
    return None if dt is not None and dt.is_floating_point else f"x is {dt}, not a floating type"


def _close(v, want: float, rel: float) -> bool:
    v = number(v)
    return v is not None and math.isclose(v, want, rel_tol=rel)


def _check_constants(m):
    """The formula's constants; anything else is a different function."""
    wrong = []
    if not _close(m["half"], 0.5, 0.0):
        wrong.append(f"half {m['half']!r} != 0.5")
    if not _close(m["k"], _SQRT_2_OVER_PI, 1e-6):
        wrong.append(f"scale {m['k']!r} != sqrt(2/pi)")
    if not _close(m["c"], 0.044715, 1e-6):
        wrong.append(f"cubic coefficient {m['c']!r} != 0.044715")
    if "three" in m.bindings and not _close(m["three"], 3.0, 0.0):
        wrong.append(f"exponent {m['three']!r} != 3")
    return "; ".join(wrong) or None


def _replace(m, graph):
    return make_node(graph, aten.gelu.default, (m["x"],), {"approximate": "tanh"}, like=m.root)


_CHECKS = (_check_float, _check_constants)
RULES = [Rewrite(fn.__name__, Pattern(fn), _replace, _CHECKS, produces="gelu")
         for fn in (gelu_new_half_last, gelu_fast, gelu_new)]

#: ``explain``: a ``tanh`` that did not fuse is reported only when a rule's shape matched
#: around it and a named check refused (another coefficient, a non-float input): ``tanh``
#: alone is too common (soft-capping, gates) to report each one as a missed GELU. The rule's
#: root is three users below it (``tanh -> add -> mul -> mul``).
CANDIDATES = (Candidate(lambda n: n.target is aten.tanh.default, hops=3, require_check=True),)

FAMILY = register_family(FusionFamily("gelu_tanh", RULES, op=aten.gelu.default, candidates=CANDIDATES,
                                      title="GELU (tanh)", order=30))
