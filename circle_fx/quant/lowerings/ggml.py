"""GGML block-quantized layers (``circle.linear_ggml``, ``circle.embedding_ggml``) in the forms
onert 0.1.0 runs (measured: ``docs/onert-findings.md``, "GGML blocks").

- ``linear_ggml`` -> ``FULLY_CONNECTED`` (float32 input, ``GGML_Q8_0`` / ``GGML_Q4_0`` weight
  ``[out, in]``, its bias and fused activation) -> ``RESHAPE`` back to the leading dims. The
  ggml kernel throws on a bias and ignores a fused activation (measured:
  ``benchmarks/onert_fc_activation.py``), so the ``ggml_bias`` legalization step
  (``emit/legalize/forms.py``) moves both into an ``ADD`` after it (of zeros when there is no
  bias; exact); ``verify`` reports either on a GGML FC. The kernel quantizes the activations per block of 32
  (ggml's Q8 dot product), ~0.4 % of |y| for Q8_0 weights, far below the hybrid int8 path's
  per-row activation quantization.
- ``embedding_ggml`` -> ``GATHER`` from a ``GGML_Q4_0`` table: onert returns the dequantized
  rows (exact); its indices must be int32 and 1-D: with indices ``[B, T]``, B > 1, onert fills
  only the first B-row and leaves the rest zero (measured). The lowering emits the plain GATHER
  of the ids; the ``ggml_gather_ids`` legalization step CASTs them to int32, flattens them and
  RESHAPEs the rows back (``limits.ggml_gather_ids``, which ``verify`` reports). A ``GGML_Q8_0`` table fails at
  run time in onert 0.1.0, so it is refused here.

Static shapes only: a dynamic row count is refused with a clear error (the weight-only int8
path, which the quantize pass uses instead, handles it).
"""
from __future__ import annotations

import torch

from ...circle import ggml
from ...circle.schema import BO, make_options as options
from ...emit.lowerings._fc import fully_connected, rows_input
from ...emit.registry import lowering
from ...fx_utils import arguments
from ...dialect.weights import embedding_ggml, ggml_in_features, linear_ggml


def _weight(ctx, blocks, kind: str, what: str) -> int:
    if kind not in ggml.BY_NAME:
        raise ctx.error(f"unknown GGML block type {kind!r}; expected one of {sorted(ggml.BY_NAME)}")
    if ctx.constant(blocks) is None or ctx.dtype(blocks) != torch.uint8 or ctx.rank(blocks) != 2:
        raise ctx.error(f"{what} must be a constant uint8 [rows, row_bytes] tensor of {kind} blocks, "
                        f"got %{blocks.name}")
    b = ggml.BY_NAME[kind]
    rows, row_bytes = ctx.dims(blocks, static=True)
    if row_bytes % b.block_bytes:
        raise ctx.error(f"{what}: {row_bytes} bytes per row is not a whole number of {kind} blocks "
                        f"({b.block_bytes} bytes each)")
    cols = ggml_in_features(ctx.constant(blocks), kind)
    return ctx.packed_const(blocks, b.circle_type, [rows, cols], blocks.name)


@lowering(linear_ggml)
def lower_linear_ggml(ctx, node):
    x, blocks, kind, bias, activation = arguments(node)
    if ctx.dtype(x) != torch.float32:
        raise ctx.error(f"a {kind} linear needs a float32 input, got {ctx.dtype(x)}")
    wt = _weight(ctx, blocks, kind, f"the {kind} weight")
    for v in (x, node):  # static shapes only (module docstring): raises on a dynamic dim
        ctx.dims(v, static=True)
    # the plain FC, bias and activation on it: the ggml_bias legalization step moves them into an ADD
    fully_connected(ctx, node, rows_input(ctx, x), wt, -1 if bias is None else ctx.tensor(bias), name=f"fc_{kind}",
                    dtype=torch.float32, activation=activation)


@lowering(embedding_ggml)
def lower_embedding_ggml(ctx, node):
    blocks, kind, ids = node.args
    if kind != ggml.Q4_0.name:
        raise ctx.error(f"GATHER from a {kind} table fails at run time in onert 0.1.0; only q4_0 tables "
                        "are gathered (the quantize pass stores other embeddings as uint8 rows)")
    table = _weight(ctx, blocks, kind, "the embedding table")
    # plain GATHER of the ids as they are: onert's GGML GATHER takes 1-D int32 ids only, which
    # the ggml_gather_ids legalization step (emit/legalize/forms.py) makes them
    ctx.dims(ids, static=True)
    ctx.op(BO.GATHER, [table, ctx.tensor(ids)], [ctx.output(node)], options("GatherOptions", axis=0, batchDims=0))
