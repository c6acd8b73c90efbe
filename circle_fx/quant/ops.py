"""Custom ops for weight-only quantized layers: ``circle.linear_w8``, ``circle.embedding_w8``.

The quantize pass replaces ``aten.linear`` / ``aten.embedding`` whose weight it quantized by
these, so the rewritten FX graph still runs in eager PyTorch (``program.run``) and computes
exactly what the Circle file encodes, with the dequantized weights. That makes the two error
sources separately testable: the graph vs the float model is the weight rounding; onert vs the
graph is the runtime's kernel (its hybrid FULLY_CONNECTED quantizes activations per row).

- ``linear_w8(x, weight, scale, bias)``: ``weight`` int8 ``[O, I]``, ``scale`` float ``[O]``;
  ``y = (x @ weight.T) * scale + bias``. Rows are independent, so weights merged along the
  output dim (q/k/v) merge by concatenating ``weight`` and ``scale``.
- ``embedding_w8(table, scale, zero_point, indices)``: ``table`` uint8 (or int8 when the table
  is shared with a linear, tied ``lm_head``) ``[V, D]``, ``scale`` float ``[V]``;
  ``y = (table[indices] - zero_point) * scale[indices, None]``.
"""
from __future__ import annotations

from typing import Optional

import torch

_lib = torch.library.Library("circle", "FRAGMENT")  # noqa: keep a reference for the process lifetime
_lib.define("linear_w8(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor")
_lib.define("embedding_w8(Tensor table, Tensor scale, int zero_point, Tensor indices) -> Tensor")


def _linear_w8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
    return y if bias is None else y + bias


def _linear_w8_fake(x, weight, scale, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _embedding_w8(table: torch.Tensor, scale: torch.Tensor, zero_point: int, indices: torch.Tensor) -> torch.Tensor:
    rows = table[indices].to(torch.float32) - zero_point
    return rows * scale[indices].unsqueeze(-1).to(torch.float32)


def _embedding_w8_fake(table, scale, zero_point, indices):
    return torch.empty((*indices.shape, table.shape[1]), dtype=torch.float32, device=indices.device)


_lib.impl("linear_w8", _linear_w8, "CompositeExplicitAutograd")
_lib.impl("embedding_w8", _embedding_w8, "CompositeExplicitAutograd")
torch.library.register_fake("circle::linear_w8", _linear_w8_fake, lib=_lib)
torch.library.register_fake("circle::embedding_w8", _embedding_w8_fake, lib=_lib)

linear_w8 = torch.ops.circle.linear_w8.default
embedding_w8 = torch.ops.circle.embedding_w8.default
