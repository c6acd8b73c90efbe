"""Lowerings of the quantized ops: ``weights`` (weight-only int8 layers, ``circle.*_w8``),
``ggml`` (GGML block weights, ``circle.*_ggml``) and ``static`` (PT2E graphs: QUANTIZE / DEQUANTIZE and the integer kernels ``circle.q_*``).

Imported (hence registered) by ``circle_fx/__init__.py``, with the built-ins, before any user
code can register a lowering; :data:`circle_fx.emit.registry.BUILTIN_PACKAGES` names this
package so that both count as built-in lowerings.
"""
from . import ggml, static, weights  # noqa: F401  (registers the lowerings)
