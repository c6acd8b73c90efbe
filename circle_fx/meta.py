"""The keys circle_fx stores in ``node.meta`` / ``gm.meta``: the IR's side channel.

One module with no imports, so a pass, the quantizer and the emitter can all name a key
without importing one another (the emitter reads what the passes write).
"""

#: ``node.meta`` key of a node's :class:`~circle_fx.circle.schema.QuantParams` (set by the
#: quantization passes; the emitter attaches them to the node's Circle tensor)
QUANT_META = "circle_fx.quant"

#: ``node.meta`` key on a dequantize node, and on the float constant constant folding makes
#: of it: ``(QuantParams, dtype)`` of the integers it came from (:mod:`circle_fx.quant.qdq`)
DEQUANTIZED_FROM = "circle_fx.dequantized_from"

#: ``gm.meta`` key: folded constant name -> the model attribute it came from (for messages
#: and skip lists)
CONSTANT_NAMES = "circle_fx.constant_names"

#: ``node.meta`` key forcing a linear's Circle form (:mod:`circle_fx.emit.linear_form`)
LINEAR_FORM = "circle_fx.linear_form"

#: ``node.meta`` key on an integer constant (int8/uint8 values) stored as a 4-bit Circle tensor
#: (``"INT4"`` / ``"UINT4"``: two elements per byte, :mod:`circle_fx.circle.int4`); set by the
#: Q/DQ pass for weights quantized into [-8, 7] / [0, 15], read by the emitter's ``ctx.tensor``
STORAGE_4BIT = "circle_fx.storage_4bit"
