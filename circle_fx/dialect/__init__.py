"""The ``circle::`` dialect: every torch custom op circle_fx's graphs hold (``torch.ops.circle.*``).

One torch library, one :func:`define`, one registry (:func:`ops`). Each op is defined by its
owner: a fusion family defines the op its rules produce in the family's own file (RMSNorm,
RoPE, SiLU...), and this package holds the ops no family owns: the channels-last convolutions
and pools (:mod:`.nhwc`), the decode step's attention over a KV cache (:mod:`.attention`), the weight-only quantized layers (:mod:`.weights`) and the integer
kernels of PT2E graphs (:mod:`.quantized`). Every op has a real eager kernel and a fake (meta)
kernel, so a rewritten FX graph still runs in PyTorch (``program.run``), can be compared
numerically with the graph it came from, and shape propagation keeps working.

An op states its traits where it is defined (``traits=("elementwise",)``, names or
:mod:`circle_fx.op_traits` objects): the passes ask the traits table, so a new elementwise op is
moved through by the layout pass, looked through by the analyses... without naming it anywhere
else. ``traits=()`` says "no trait" (a pass then treats the op as opaque).
"""
from __future__ import annotations

from .base import NAMESPACE, DialectOp, define, ops
from . import attention, nhwc, quantized, weights  # noqa: F401  (the ops no fusion family owns)

__all__ = ["DialectOp", "NAMESPACE", "define", "ops", "attention", "nhwc", "quantized", "weights"]
