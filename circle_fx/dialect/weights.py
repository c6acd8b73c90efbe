"""Custom ops for weight-only quantized layers: ``circle.linear_w8``, ``circle.embedding_w8``.

The quantize pass replaces ``aten.linear`` / ``aten.embedding`` whose weight it quantized by
these, so the rewritten FX graph still runs in eager PyTorch (``program.run``) and computes
exactly what the Circle file encodes, with the dequantized weights. That makes the two error
sources separately testable: the graph vs the float model is the weight rounding; onert vs the
graph is the runtime's kernel (its hybrid FULLY_CONNECTED quantizes activations per row).

- ``linear_w8(x, weight, scale, bias, activation="none")``: ``weight`` int8 ``[O, I]``, ``scale``
  float ``[O]``; ``y = act((x @ weight.T) * scale + bias)``, ``act`` none / relu / relu6 (a
  ``circle.linear_act`` the ``linear_activation`` family fused). Rows are independent, so
  weights merged along the output dim (q/k/v) merge by concatenating ``weight`` and ``scale``.
- ``embedding_w8(table, scale, zero_point, indices)``: ``table`` uint8 (or int8 when the table
  is shared with a linear, tied ``lm_head``) ``[V, D]``, ``scale`` float ``[V]``;
  ``y = (table[indices] - zero_point) * scale[indices, None]``.
- ``linear_ggml(x, blocks, kind, bias, activation="none")``: ``blocks`` uint8
  ``[O, I / 32 * block_bytes]``, GGML ``kind`` ``"q8_0"`` / ``"q4_0"`` (:mod:`circle_fx.circle.ggml`);
  ``y = act(x @ dequant(blocks).T + bias)``.
- ``embedding_ggml(blocks, kind, indices)``: the rows ``indices`` of the dequantized table.
- ``conv2d_w8(x, weight, scale, bias, stride, padding, dilation, groups, activation)``:
  ``circle.conv2d_nhwc`` (NHWC ``x``, explicit pads, fused activation) with an int8 ``weight``
  ``[O, I/groups, kH, kW]`` and one float ``scale`` per output channel ``[O]``: the convolution
  with ``weight * scale[:, None, None, None]``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..circle import ggml
from .base import define
from .nhwc import ACTIVATIONS, conv2d_nhwc


def _linear_w8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: Optional[torch.Tensor], activation: str = "none") -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
    return ACTIVATIONS[activation](y if bias is None else y + bias)


def _linear_w8_fake(x, weight, scale, bias, activation="none"):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _embedding_w8(table: torch.Tensor, scale: torch.Tensor, zero_point: int, indices: torch.Tensor) -> torch.Tensor:
    rows = table[indices].to(torch.float32) - zero_point
    return rows * scale[indices].unsqueeze(-1).to(torch.float32)


def _embedding_w8_fake(table, scale, zero_point, indices):
    return torch.empty((*indices.shape, table.shape[1]), dtype=torch.float32, device=indices.device)


def ggml_in_features(blocks: torch.Tensor, kind: str) -> int:
    """The input features of a GGML weight stored as ``blocks`` [O, row_bytes]."""
    b = ggml.BY_NAME[kind]
    return blocks.shape[1] // b.block_bytes * ggml.BLOCK


def ggml_dequantize(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """The float32 weight [O, I] that ``blocks`` encode (what onert's kernel multiplies by)."""
    b = ggml.BY_NAME[kind]
    shape = (blocks.shape[0], ggml_in_features(blocks, kind))
    return torch.from_numpy(ggml.dequantize(b, blocks.contiguous().numpy(), shape))


def _linear_ggml(x, blocks, kind: str, bias, activation: str = "none"):
    y = torch.nn.functional.linear(x, ggml_dequantize(blocks, kind).to(x.dtype))
    return ACTIVATIONS[activation](y if bias is None else y + bias)


def _linear_ggml_fake(x, blocks, kind, bias, activation="none"):
    return x.new_empty((*x.shape[:-1], blocks.shape[0]))


def _embedding_ggml(blocks, kind: str, indices):
    rows = blocks[indices.reshape(-1)]
    return ggml_dequantize(rows, kind).reshape(*indices.shape, -1)


def _embedding_ggml_fake(blocks, kind, indices):
    return torch.empty((*indices.shape, ggml_in_features(blocks, kind)), dtype=torch.float32, device=indices.device)


def _conv2d_w8(x, weight, scale, bias, stride, padding, dilation, groups: int, activation: str = "none"):
    w = weight.to(x.dtype) * scale.to(x.dtype).reshape(-1, 1, 1, 1)
    return conv2d_nhwc(x, w, bias, stride, padding, dilation, groups, activation)


linear_w8 = define("linear_w8(Tensor x, Tensor weight, Tensor scale, Tensor? bias, str activation=\"none\") -> Tensor",
                   _linear_w8, _linear_w8_fake)
embedding_w8 = define("embedding_w8(Tensor table, Tensor scale, int zero_point, Tensor indices) -> Tensor",
                      _embedding_w8, _embedding_w8_fake)
linear_ggml = define("linear_ggml(Tensor x, Tensor blocks, str kind, Tensor? bias, str activation=\"none\") -> Tensor",
                     _linear_ggml, _linear_ggml_fake)
embedding_ggml = define("embedding_ggml(Tensor blocks, str kind, Tensor indices) -> Tensor",
                        _embedding_ggml, _embedding_ggml_fake)
conv2d_w8 = define("conv2d_w8(Tensor x, Tensor weight, Tensor scale, Tensor? bias, int[] stride, int[] padding, "
                   "int[] dilation, int groups, str activation=\"none\") -> Tensor", _conv2d_w8, _conv2d_w8)
