"""The keys circle_fx stores in ``node.meta`` / ``gm.meta``: the IR's side channel.

One module importing nothing of circle_fx, so a pass, the quantizer and the emitter can all
name a key without importing one another (the emitter reads what the passes write). Every
key circle_fx writes is here (torch's own, ``val`` and ``stack_trace``, and torchao's
``quantization_annotation`` are theirs).
"""
from __future__ import annotations

from dataclasses import dataclass

#: ``node.meta`` key of a node's :class:`~circle_fx.circle.schema.QuantParams` (set by the
#: quantization passes; the emitter attaches them to the node's Circle tensor)
QUANT_META = "circle_fx.quant"

#: ``node.meta`` key on a dequantize node, and on the float constant constant folding makes
#: of it: ``(QuantParams, dtype)`` of the integers it came from (:mod:`circle_fx.quant.qdq`)
DEQUANTIZED_FROM = "circle_fx.dequantized_from"

#: ``gm.meta`` key: folded constant name -> the model attribute it came from (for messages
#: and skip lists)
CONSTANT_NAMES = "circle_fx.constant_names"

#: ``gm.meta`` key: attribute-name stem -> how many constants :func:`circle_fx.program.add_constant`
#: registered under it (fresh names without rescanning the module)
CONST_COUNTER = "circle_fx.const_counter"

#: ``node.meta`` key forcing a linear's Circle form (:mod:`circle_fx.emit.linear_form`)
LINEAR_FORM = "circle_fx.linear_form"

#: ``node.meta`` key on the permutes the layout pass moved out of a layout permute (any rank
#: and order): layout permutes too, so later ops move them on (:mod:`circle_fx.layout.propagate`)
LAYOUT_PERMUTE = "circle_fx.layout_permute"

#: ``gm.meta`` key: False turns the legalization's peephole step off (:mod:`circle_fx.emit.legalize.peephole`)
PEEPHOLE = "circle_fx.peephole"

#: ``node.meta`` key on an ``aten.index.Tensor`` node: its :class:`IndexFacts`, written by the
#: ``index_facts`` analysis pass (:mod:`circle_fx.passes.index_facts`, the last pass of
#: ``finalize_pipeline``), read by its lowering (:mod:`circle_fx.emit.lowerings.gather`)
INDEX_FACTS = "circle_fx.index_facts"


@dataclass(frozen=True)
class IndexFacts:
    """What dataflow says about an indexing node's operands (the GATHER lowering's choices)."""

    #: dims of the indexed tensor along which all its slices are equal (an index there selects nothing)
    repeated_dims: frozenset = frozenset()
    #: the indexed tensor holds positions or counts (an ``arange`` or a ``cumsum`` of bools, moved
    #: around): int64, but it fits int32
    table_counts_positions: bool = False
    #: the dims whose index tensor is never negative (a position: ``topk``/``sort`` indices, ``argmax``,
    #: ``arange`` from a start >= 0), so no wrap is emitted for it
    never_negative: frozenset = frozenset()

#: ``node.meta`` key on an integer constant (int8/uint8 values) stored as a 4-bit Circle tensor
#: (``"INT4"`` / ``"UINT4"``: two elements per byte, :mod:`circle_fx.circle.int4`); set by the
#: Q/DQ pass for weights quantized into [-8, 7] / [0, 15], read by the emitter's ``ctx.tensor``
STORAGE_4BIT = "circle_fx.storage_4bit"
