"""GGML block-quantized tensor types (circle-schema 0.10 ``GGML_Q8_0`` / ``GGML_Q4_0``): the byte layout.

onert 0.1.0 runs FULLY_CONNECTED with such a weight (float32 input/output, no bias input) and
GATHER from a ``GGML_Q4_0`` table (``../shared/FACTS.md``, ``docs/onert-findings.md``). The
layout is ggml's: a weight ``[out, in]`` is cut into blocks of 32 consecutive elements along
``in``; each block is a float16 scale ``d`` followed by its quants:

- Q8_0: 32 int8 ``q``; value = ``q * d`` (34 bytes per block);
- Q4_0: 16 bytes; byte ``j`` holds element ``j`` in its low nibble and element ``j + 16`` in its
  high nibble; value = ``(nibble - 8) * d`` (18 bytes per block).

The tensor's Circle shape stays ``[out, in]``; its buffer is the raw blocks, row after row.
This module only describes and decodes the format (numpy, no torch): choosing the scales is the
quantizer's business (:mod:`circle_fx.quant.ggml`), and ``verify`` / ``inspect`` use the sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .schema import TT

BLOCK = 32  #: elements per block, along the last dim


@dataclass(frozen=True)
class BlockType:
    name: str  #: "q8_0" / "q4_0": the name used by ``quantize=`` and ``summary()``
    circle_type: int
    block_bytes: int

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / BLOCK

    def row_bytes(self, cols: int) -> int:
        return cols // BLOCK * self.block_bytes

    def nbytes(self, shape) -> int:
        """Bytes of a tensor of ``shape`` (last dim a multiple of 32)."""
        shape = list(shape)
        return math.prod(shape[:-1]) * self.row_bytes(shape[-1]) if shape else 0

    def record(self):
        """The numpy structured dtype of one block."""
        quants = ("q", "i1", (BLOCK,)) if self.name == "q8_0" else ("q", "u1", (BLOCK // 2,))
        return np.dtype([("d", "<f2"), quants])


Q8_0 = BlockType("q8_0", TT.GGML_Q8_0, 2 + BLOCK)
Q4_0 = BlockType("q4_0", TT.GGML_Q4_0, 2 + BLOCK // 2)
BY_NAME = {b.name: b for b in (Q8_0, Q4_0)}
BY_CIRCLE_TYPE = {b.circle_type: b for b in (Q8_0, Q4_0)}


def block_type(tensor_type: int) -> BlockType | None:
    """The block layout of a Circle tensor type, None for a plain (element) type."""
    return BY_CIRCLE_TYPE.get(tensor_type)


def dequantize(kind: BlockType, data, shape) -> np.ndarray:
    """float32 ``shape`` from the raw blocks ``data`` (bytes or a uint8 array): the reference
    that onert's kernels compute with."""
    shape = list(shape)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    rec = np.frombuffer(np.ascontiguousarray(data).tobytes() if not isinstance(data, (bytes, memoryview))
                        else data, dtype=kind.record()).reshape(rows, cols // BLOCK)
    d = rec["d"].astype(np.float32)[..., None]
    if kind is Q8_0:
        q = rec["q"].astype(np.float32)
    else:
        packed = rec["q"]
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.float32) - 8
    return (q * d).reshape(shape)
